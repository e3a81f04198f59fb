"""`specroute eval`: run scenarios on the virtual clock, print tables, write `DIR/eval.json`.

    specroute eval --scenario NAME[,NAME...]|all --output DIR [--seed S[,S...]] [--objective latency|throughput]
                   [--fleet FLEET|plan|homogeneous ...] [--servers N] [--slo ttft=S,tpot=S]
    specroute eval --traffic trace:PATH|NAME|FILE [--trace-window START:SECONDS] [--trace-speedup F]
                   [--trace-sample K:R] [--thinking-share F] ... --output DIR

Writes `DIR/eval.json` (schema in `evaluate.report`) and `DIR/eval.md` (markdown tables for
docs/evaluation.md). Without `--objective` both objectives run (goodput and clairvoyant once each).

`--fleet` (repeatable) runs each scenario on that fleet instead of its own pool
(`evaluate.fleet`: `2xk26-ddtree:b=16,2xk26-dflash`); `plan` is the fleet `specroute plan`
picks for the scenario's traffic (open-loop scenarios), `homogeneous` every homogeneous fleet of
`--servers` (default: the scenario's pool size) over plan's server types, behind specroute's and
SGLang's router's policies. With `plan` and `homogeneous` both given, the fleet targets of docs/evaluation.md
are checked (`evaluate.fleet_targets`). Exit status 0 when the runs completed (targets are
reported, not enforced: this is a benchmark), 2 on bad arguments.

`--traffic` evaluates a traffic instead of scenarios (`evaluate.traffic`): a recorded trace
(`trace:PATH`, replayed at its own arrival times with loadgen's semantics: the trace options are
loadgen's), a named traffic or a traffic file, on the K2.6 seed pool unless `--fleet` says.

`--seed 0,1,2,3,4` runs every scenario and fleet on each seed and reports the means
(`evaluate.seeds`): one phase's figures move by several percent with the seed, and a target
judged on one seed can pass or fail on noise. `plan` (for `--fleet plan`) uses the first seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from common.output_dir import output_dir
from evaluate.fleet import FleetError, parse_fleet
from evaluate.report import markdown, print_scenario, print_targets, to_json, write_json
from evaluate.runner import ScenarioResult, on_fleet
from evaluate.scenarios import SCENARIOS, Scenario
from evaluate.seeds import parse_seeds, run_seeds
from evaluate.slo import DEFAULT_SLO, SloError, parse_slo
from evaluate.targets import Target, check_targets
from evaluate.traffic import TrafficError, load_traffic
from loadgen.trace_args import add_trace_arguments, trace_flags_given, trace_options
from loadgen.trace_file import TraceError
from policies.goodput import OBJECTIVES

__all__ = ["main", "parser"]

# On a homogeneous fleet the contestants that matter: the SGLang router's policies (the user's
# alternative), specroute's, and the clairvoyant references the ratios need.
HOMOGENEOUS_CONTESTANTS = (
    "least_inflight",
    "goodput/latency",
    "sglang/round_robin",
    "sglang/power_of_two",
    "sglang/least_load",
    "sglang/cache_aware",
    "clairvoyant/e2e",
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specroute eval", description="Evaluate routing policies against the twin's engine on a virtual clock."
    )
    ap.add_argument(
        "--scenario", default="all", help=f"scenario name(s), comma-separated, or 'all' (known: {', '.join(SCENARIOS)})"
    )
    ap.add_argument("--output", required=True, type=output_dir, help="directory for eval.json")
    ap.add_argument(
        "--seed",
        type=parse_seeds,
        default=[0],
        help="seed, or comma-separated seeds whose results are averaged (default 0)",
    )
    ap.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=None,
        help="run goodput/clairvoyant for this objective only (default: both)",
    )
    ap.add_argument(
        "--fleet", action="append", default=[], help="run on this fleet (repeatable): FLEET, 'plan' or 'homogeneous'"
    )
    ap.add_argument(
        "--servers",
        type=int,
        default=None,
        help="fleet size for --fleet plan/homogeneous (default: the scenario's pool size)",
    )
    ap.add_argument("--slo", default=None, help=f"ttft=S,tpot=S in seconds (default {DEFAULT_SLO.label})")
    ap.add_argument(
        "--traffic",
        default=None,
        help="evaluate this traffic instead of --scenario: trace:PATH (a Mooncake, Azure or BurstGPT trace), "
        "a named traffic or a traffic file (specroute plan's)",
    )
    add_trace_arguments(ap)
    ap.add_argument(
        "--profiles",
        metavar="DIR|FILE,...",
        help="the server types of --fleet plan and homogeneous: every .toml in DIR, or the files named "
        "(`specroute profile` measures them); a named scenario's loads then refer to the first of them",
    )
    return ap


def _scenarios(args: argparse.Namespace) -> dict[str, Scenario]:
    """The scenarios to run, by name: --traffic's, else --scenario's; ValueError names a bad one."""
    if args.traffic is None:
        if trace_flags_given(args) or args.thinking_share is not None:
            raise ValueError("the trace options (--trace-*, --thinking-*) need --traffic trace:PATH")
        names = list(SCENARIOS) if args.scenario == "all" else args.scenario.split(",")
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            raise ValueError(f"unknown scenario {unknown[0]!r} (known: all, {', '.join(SCENARIOS)})")
        return {n: SCENARIOS[n] for n in names}
    if args.scenario != "all":
        raise ValueError("give --scenario or --traffic, not both")
    is_trace = args.traffic.startswith("trace:")
    if not is_trace and (trace_flags_given(args) or args.thinking_share is not None):
        raise ValueError("the trace options (--trace-*, --thinking-*) need --traffic trace:PATH")
    traffic = load_traffic(args.traffic, trace_options(args) if is_trace else None)
    return {traffic.scenario.name: traffic.scenario}


def _fleets_for(
    scenario: Scenario,
    specs: list[str],
    servers: int | None,
    seed: int,
    log: Callable[[str], None],
    plan_policy: dict[str, str],
    types: list[str] | None = None,
) -> list[tuple[str, str]]:
    """(role, fleet) pairs: role is 'own', 'given', 'plan' or 'homogeneous'; the plan's policy
    for its fleet goes into `plan_policy`. `types`: the server types of plan and homogeneous
    (default plan's)."""
    from evaluate.plan import DEFAULT_TYPES

    types = types or list(DEFAULT_TYPES)
    n = servers or sum(m.count for m in parse_fleet(",".join(scenario.pool)))
    out: list[tuple[str, str]] = []
    for spec in specs or ["own"]:
        if spec == "own":
            out.append(("own", ",".join(scenario.pool)))
        elif spec == "homogeneous":
            out += [("homogeneous", f"{n}x{t}") for t in types]
        elif spec == "plan":
            from evaluate.plan import plan
            from evaluate.traffic import Traffic

            if not scenario.open_loop:
                raise FleetError(f"--fleet plan needs an open-loop scenario; {scenario.name} is closed loop")
            log(f"planning {n} servers for {scenario.name} ...")
            res = plan(
                n,
                Traffic(name=scenario.name, scenario=scenario, rates=tuple(None for _ in scenario.phases)),
                seed=seed,
                types=types,
                log=log,
            )
            out.append(("plan", res.ranked[0].fleet))
            plan_policy[scenario.name] = res.ranked[0].policy
        else:
            parse_fleet(spec)
            out.append(("given", spec))
    return out


def main(argv: list[str]) -> int:
    ap = parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        chosen = _scenarios(args)
        slo = parse_slo(args.slo) if args.slo is not None else DEFAULT_SLO
        for spec in args.fleet:
            if spec not in ("plan", "homogeneous"):
                parse_fleet(spec)
        if args.servers is not None and not 1 <= args.servers <= 16:
            raise FleetError(f"--servers {args.servers}: between 1 and 16")
        types = None
        if args.profiles is not None:
            from evaluate.server_types import profile_types

            types = profile_types(args.profiles)
    except (SloError, FleetError, TrafficError, TraceError, ValueError) as e:
        print(f"specroute eval: {e}", file=sys.stderr)
        return 2
    objectives = [args.objective] if args.objective else list(OBJECTIVES)
    primary = objectives[0]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    results: list[ScenarioResult] = []
    groups: dict[str, list[tuple[str, ScenarioResult]]] = {}
    plan_policy: dict[str, str] = {}
    for name, scenario in chosen.items():
        try:
            if types is not None:
                from evaluate.server_types import with_reference

                scenario = with_reference(scenario, types, None)
            specs = args.fleet or (["homogeneous"] if types is not None else [])
            fleets = _fleets_for(scenario, specs, args.servers, args.seed[0], log, plan_policy, types)
        except FleetError as e:
            print(f"specroute eval: {e}", file=sys.stderr)
            return 2
        for role, fleet in fleets:
            moved = scenario if role == "own" else on_fleet(scenario, fleet)
            only = HOMOGENEOUS_CONTESTANTS if role == "homogeneous" else None
            res = run_seeds(moved, args.seed, objectives=objectives, primary=primary, slo=slo, only=only)
            if len(fleets) > 1:
                res = msgspec.structs.replace(res, name=f"{name}@{res.fleet}")
            print_scenario(res, sys.stdout)
            sys.stdout.flush()
            results.append(res)
            groups.setdefault(name, []).append((role, res))
    targets: list[Target] = check_targets([r for r in results if "@" not in r.name])
    extra: list[str] = []
    fleets_doc: dict[str, Any] = {}
    if any(role == "plan" for g in groups.values() for role, _ in g) or "sessions" in groups:
        from evaluate.fleet_targets import check_fleet_targets, fleet_table

        fleet_t, fleets_doc = check_fleet_targets(groups, plan_policy, chosen)
        targets += fleet_t
        table = fleet_table(groups)
        extra = table if len(table) > 4 else []  # only with homogeneous fleets to compare
    for res in results:
        if not chosen[res.name.split("@")[0]].open_loop:
            continue  # a closed loop's first minute is its first phase, already judged against the clairvoyant
        for key, c in res.cold_start.items():
            targets.append(
                Target(
                    name=f"{res.name}: cold-start regret of {key} (first {c['window_s']:.0f} s vs the clairvoyant)",
                    holds=None,
                    value=f"{100 * c['regret']:.1f}% ({c['request_tok_s']} vs {c['reference_tok_s']} req tok/s)",
                )
            )
    print_targets(targets, sys.stdout)
    path = args.output / "eval.json"
    write_json(
        path, to_json(results, targets, seeds=args.seed, objectives=objectives, primary=primary, fleets=fleets_doc)
    )
    # the homogeneous fleets appear in the fleet-vs-fleet table, not phase by phase
    shown = [res for g in groups.values() for role, res in g if role != "homogeneous"]
    (args.output / "eval.md").write_text(markdown(shown, targets, seeds=args.seed, extra=extra))
    print(f"\nwrote {path} and eval.md ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
