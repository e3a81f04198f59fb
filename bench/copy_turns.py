"""Copy-heavy turns on the virtual clock: specroute's goodput with its copy cell against the same
policy blind to copies (`RequestFeatures.copy_of` cleared), per fleet (docs/evaluation.md,
"Copy-heavy turns").

    python -m bench.copy_turns [--traffic docs/examples/rewrites.jsonl] [--fleet F;F...] [--seed 0,1,2]

Per fleet and policy: mean request decode tok/s, SLO goodput (requests/s within the bench SLO),
the mean tok/s of the copy turns and the share of them served by an NGRAM server that generated
their source (the only place a trie holds it). The target: copy-aware >= copy-blind on mean
request tok/s on every fleet (a feature that costs where it cannot help is a regression). A
benchmark: it reports its target and does not fail on it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from backends import BackendSpec
from evaluate.runner import on_fleet
from evaluate.sim import RunResult, simulate
from evaluate.slo import SLO
from evaluate.traffic import load_traffic
from policies.base import BackendView, Decision, Outcome, Policy, RequestFeatures
from policies.goodput import Goodput

__all__ = ["CopyBlind", "main"]

ROOT = Path(__file__).resolve().parent.parent
TRAFFIC = ROOT / "docs" / "examples" / "rewrites.jsonl"
FLEETS = "k26-ar,k26-ngram;k26-eagle3,k26-ngram;k26-ngram,k26-dflash"
SLO_USED = SLO(ttft_s=10.0, tpot_s=0.1)


class CopyBlind:
    """A policy shown every request without its copy link: what specroute routed before."""

    name = "goodput"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        return self.inner.choose(msgspec.structs.replace(request, copy_of=0), candidates)

    def observe(self, outcome: Outcome) -> None:
        f = outcome.features
        if f is not None:
            outcome = msgspec.structs.replace(outcome, features=msgspec.structs.replace(f, copy_of=0))
        self.inner.observe(outcome)


def _figures(run: RunResult) -> tuple[float, float, float, float]:
    """(mean request tok/s, SLO goodput req/s, copy turns' mean tok/s, their share on their writer
    when it is an NGRAM server)."""
    done = [r for r in run.records if r.status == "ok" and r.decode_tok_s is not None]
    span = max((r.t_last for r in done), default=0.0) - min((r.t_send for r in done), default=0.0)
    good = [r for r in done if SLO_USED.met(r.ttft_s, r.tpot_s)]
    by_turn = {(r.session, r.turn): r for r in done}
    copies = [r for r in done if r.copy]
    sources = [by_turn.get((r.session, r.turn - 1)) for r in copies]
    ngram_written = [(r, s) for r, s in zip(copies, sources, strict=True) if s is not None and "ngram" in s.backend]
    kept = sum(r.backend == s.backend for r, s in ngram_written)

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    return (
        mean([r.decode_tok_s or 0.0 for r in done]),
        len(good) / span if span > 0 else 0.0,
        mean([r.decode_tok_s or 0.0 for r in copies]),
        kept / len(ngram_written) if ngram_written else 0.0,
    )


def _factory(seed: int, blind: bool) -> Callable[[Any, list[BackendSpec]], Policy]:
    def make(engines: Any, specs: list[BackendSpec]) -> Policy:
        rule = Goodput("latency", seed=seed, backends=specs, ttft_slo_s=SLO_USED.ttft_s, tpot_slo_s=SLO_USED.tpot_s)
        return CopyBlind(rule) if blind else rule

    return make


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.copy_turns", description=__doc__.split("\n\n")[0])
    ap.add_argument("--traffic", default=str(TRAFFIC), help=f"a traffic file (default {TRAFFIC.relative_to(ROOT)})")
    ap.add_argument("--fleet", default=FLEETS, help=f"fleets, ';'-separated (default {FLEETS})")
    ap.add_argument("--seed", default="0,1,2", help="comma-separated seeds, averaged")
    args = ap.parse_args(argv)
    traffic = load_traffic(args.traffic)
    seeds = [int(s) for s in args.seed.split(",")]
    rates = [r for r in traffic.rates if r is not None]
    phase_rates = rates if len(rates) == len(traffic.rates) else None
    slo = f"TTFT <= {SLO_USED.ttft_s:g} s, TPOT <= {SLO_USED.tpot_s:g} s"
    print(f"traffic {args.traffic}; seeds {args.seed}; SLO {slo}\n")
    print("| fleet | routing | req tok/s | SLO goodput req/s | copy turns tok/s | copy turns on their NGRAM writer |")
    print("|---|---|---|---|---|---|")
    holds = True
    for fleet in args.fleet.split(";"):
        scenario = on_fleet(traffic.scenario, fleet)
        means: dict[str, list[float]] = {}
        for label, blind in (("copy-blind", True), ("copy-aware", False)):
            runs = [
                _figures(simulate(scenario, _factory(seed, blind), seed=seed, phase_rates=phase_rates))
                for seed in seeds
            ]
            m = [sum(r[i] for r in runs) / len(runs) for i in range(4)]
            means[label] = m
            print(f"| {fleet} | {label} | {m[0]:.1f} | {m[1]:.3f} | {m[2]:.1f} | {m[3]:.2f} |")
        holds &= means["copy-aware"][0] >= means["copy-blind"][0] * 0.995
    verdict = "HOLDS" if holds else "FAILS"
    print(f"\n{verdict}  copy-aware >= copy-blind on mean request tok/s on every fleet (0.5% noise allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
