"""`specroute eval`: run scenarios on the virtual clock, print tables, write `DIR/eval.json`.

    specroute eval --scenario NAME|all --output DIR [--seed S] [--objective latency|throughput]

Writes `DIR/eval.json` (schema in `policies.eval.report`) and `DIR/eval.md` (a compact
markdown table for the README). Without `--objective` both objectives run (goodput and clairvoyant once each). Exit status 0
when the runs completed (targets are reported, not enforced: this is a benchmark), 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from policies.eval.report import markdown, print_scenario, print_targets, to_json, write_json
from policies.eval.runner import run_scenario
from policies.eval.scenarios import SCENARIOS
from policies.eval.targets import check_targets
from policies.goodput import OBJECTIVES

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specroute eval",
        description="Evaluate routing policies against the twin's engine on a virtual clock.")
    ap.add_argument("--scenario", default="all",
                    help=f"scenario name or 'all' (known: {', '.join(SCENARIOS)})")
    ap.add_argument("--output", required=True, type=Path, help="directory for eval.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", choices=OBJECTIVES, default=None,
                    help="run goodput/clairvoyant for this objective only (default: both)")
    return ap


def main(argv: list[str]) -> int:
    ap = parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    names = list(SCENARIOS) if args.scenario == "all" else args.scenario.split(",")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"specroute eval: unknown scenario {unknown[0]!r} (known: all, {', '.join(SCENARIOS)})",
              file=sys.stderr)
        return 2
    objectives = [args.objective] if args.objective else list(OBJECTIVES)
    primary = objectives[0]
    t0 = time.perf_counter()
    results = []
    for name in names:
        res = run_scenario(SCENARIOS[name], seed=args.seed, objectives=objectives, primary=primary)
        print_scenario(res, sys.stdout)
        sys.stdout.flush()
        results.append(res)
    targets = check_targets(results)
    print_targets(targets, sys.stdout)
    path = args.output / "eval.json"
    write_json(path, to_json(results, targets, seed=args.seed, objectives=objectives, primary=primary))
    (args.output / "eval.md").write_text(markdown(results, targets, seed=args.seed))
    print(f"\nwrote {path} and eval.md ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
