"""`specroute plan`: which N servers (profiles, DDTree budgets) to run for a traffic, on the virtual clock.

    specroute plan --servers N --traffic NAME|FILE|trace:PATH [--slo ttft=S,tpot=S] [--types T,T,...] [--seeds N]
                   [--restart-min M] [--output DIR] [--exhaustive] [--verify]
                   [--trace-window START:SECONDS] [--trace-speedup F] [--trace-sample K:R] [--thinking-share F]
    specroute plan --servers N --profiles DIR|FILE,... --traffic NAME|FILE|trace:PATH [--reference TYPE] ...

A trace (`trace:PATH`) is one phase: its window replayed at its own arrival times (loadgen's
trace options), standing for the window's length. `--profiles`: the server types are the user's
own profiles (`specroute profile` fits them from running servers): every .toml of a directory, or
the files named (evaluate/server_types.py).

Prints the fleets it simulated, ranked, with the margin over the best homogeneous fleet, whether
to reshape the fleet over the day (restarts of 1T-parameter servers priced in), and what it
assumed. Writes DIR/plan.json. Exit 0 on success, 2 on bad input (the message names the culprit),
1 when a run fails (or, with --verify, when the HTTP check disagrees with the virtual clock).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

import msgspec

from common.output_dir import output_dir
from evaluate.fleet import FleetError
from evaluate.plan import CONFIRM_SEEDS, DEFAULT_TYPES, MAX_SERVERS, RESTART_S, SEEDS, PlanResult, plan
from evaluate.slo import DEFAULT_SLO, SloError, parse_slo
from evaluate.traffic import TRACE_PREFIX, TrafficError, load_traffic, traffic_names
from loadgen.trace_args import add_trace_arguments, trace_flags_given, trace_options
from loadgen.trace_file import TraceError

__all__ = ["main", "parser", "print_plan"]

ASSUMED = (
    "Assumes: servers behave as the twin's profiles say (step time, acceptance per domain and "
    "temperature, prefill, KV, reasoning lengths; each figure's source is in its profile); traffic "
    "phases are steady samples weighed by the hours they stand for; named traffic loads are fractions of "
    "N servers of the reference profile (k26-dflash) at saturation; a restart takes --restart-min."
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specroute plan",
        description="Search fleet compositions of N servers over twin profiles (DDTree budgets included) on the "
        "virtual clock, each with its best routing policy, and rank them against the best "
        "homogeneous fleet. " + ASSUMED,
        epilog=f"Named traffic: {', '.join(traffic_names())}. A traffic FILE is JSON Lines, one phase per line "
        '(e.g. {"name": "night", "hours": 6, "rate": 2.5, "mix": {"agent": 0.4}}); see '
        "docs/evaluation.md. Server types: fleet members without a count, e.g. k26-ddtree:b=16 "
        "(b= DDTree budget, t= step-time scale, a= acceptance scale).",
    )
    ap.add_argument("--servers", type=int, required=True, help=f"fleet size N (1..{MAX_SERVERS})")
    ap.add_argument(
        "--traffic", required=True, help="a named traffic, a JSONL traffic file, or trace:PATH (a recorded trace)"
    )
    ap.add_argument(
        "--slo",
        default=None,
        help=f"ttft=S,tpot=S in seconds (default {DEFAULT_SLO.label}); given, fleets are ranked "
        "by SLO goodput (requests/s meeting it) instead of mean request tok/s",
    )
    ap.add_argument("--types", default=None, help=f"server types to compose (default {','.join(DEFAULT_TYPES)})")
    ap.add_argument(
        "--profiles",
        metavar="DIR|FILE,...",
        help="server types from profile files: every .toml in DIR, or the files named (measured with "
        "`specroute profile`); all of one model",
    )
    ap.add_argument(
        "--reference",
        metavar="TYPE",
        help="the server type a named traffic's loads are fractions of (default: the traffic's own, or the first "
        "of --profiles when that serves another model)",
    )
    ap.add_argument(
        "--restart-min",
        type=float,
        default=RESTART_S / 60,
        help=f"minutes a server is down when its type changes (default {RESTART_S / 60:.0f}: a "
        "1T-parameter model's weights, drafter, CUDA graphs, warm-up)",
    )
    ap.add_argument(
        "--sample-s",
        type=float,
        default=90.0,
        help="simulated seconds of steady traffic per phase (default 90; a bursty phase five burst cycles at "
        "least, 300 s at the default shape)",
    )
    ap.add_argument("--shortlist", type=int, default=3, help="mixed fleets simulated after the fluid ranking")
    ap.add_argument(
        "--jobs", type=_at_least_one, default=None, help="simulations in parallel (default: cores, at most 8)"
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the first seed of the traffic samples the fleets are ranked on (default 0); a mixed pick is then "
        f"simulated again, beside the best homogeneous fleet, on the {CONFIRM_SEEDS} seeds after them, and a margin "
        "that changes sign between them is reported as a tie",
    )
    ap.add_argument(
        "--seeds",
        type=_at_least_one,
        default=SEEDS,
        help=f"seeds each fleet is simulated on, its score their mean (default {SEEDS}): every fleet gets the "
        "same arrivals on a seed, and fleets within the seeds' noise of the winner are marked as ties",
    )
    ap.add_argument("--output", type=output_dir, default=None, help="directory for plan.json")
    ap.add_argument(
        "--exhaustive",
        action="store_true",
        help="also simulate every composition and report how far the plan's pick is from the best",
    )
    ap.add_argument(
        "--verify",
        action="store_true",
        help="run the winner and the best homogeneous fleet over HTTP with twins, gateway and loadgen",
    )
    ap.add_argument(
        "--verify-time-scale",
        type=float,
        default=0.5,
        help="each simulated second takes this many wall seconds during --verify (default 0.5; "
        "smaller is faster but needs CPU headroom for twins, gateway and loadgen)",
    )
    add_trace_arguments(ap)
    return ap


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def print_plan(res: PlanResult, out: TextIO) -> None:
    metric = "req tok/s" if res.objective == "tok_s" else "good req/s"
    out.write(
        f"\n== plan: {res.servers} servers for traffic {res.traffic!r} (SLO {res.slo.label}; "
        f"{res.compositions} compositions, {res.simulated} simulations, {res.wall_s:.0f} s; scores are means "
        f"over seeds {', '.join(map(str, res.seeds))})\n"
    )
    out.write(
        "phases: " + ", ".join(f"{n} {r:.2f} req/s x {_span(res.spans_s[n])}" for n, r in res.rates_rps.items()) + "\n"
    )
    width = max([44, *(len(f.fleet) for f in res.ranked)])
    out.write(
        f"{'rank':4s} {'fleet':{width}s} {'policy':20s} {metric:>10s} {'vs best homog.':>14s} "
        f"{'worst SLO':>9s} {'TTFT p99 s':>10s} {'e2e p99 s':>9s} {'shed':>5s}\n"
    )
    for i, f in enumerate(res.ranked, 1):
        ph = list(f.phases.values())
        out.write(
            f"{i:<4d} {f.fleet:{width}s} {f.policy:20.20s} {f.score:10.2f} {_pct(f.margin):>14s} "
            f"{min(p.slo_attainment for p in ph):9.2f} {max(p.ttft_p99_ms for p in ph) / 1000:10.1f} "
            f"{max(p.e2e_p99_s for p in ph):9.1f} {sum(p.shed for p in ph):5d}"
            + ("  (homogeneous)" if f.homogeneous else "")
            + ("  (a tie with the winner)" if f.tie and i > 1 else "")
            + ("" if f.slo_parity else "  (misses the SLO more often than the most reliable homogeneous fleet)")
            + "\n"
        )
    win, hom = res.ranked[0], res.best_homogeneous
    out.write(
        f"\nwinner: {win.fleet} with {win.policy}: {win.score:.2f} {metric}, {_pct(win.margin)} over the best "
        f"homogeneous fleet {hom.fleet} behind {hom.policy} ({hom.score:.2f})\n"
    )
    if res.fresh is not None:
        margins = ", ".join(_pct(m) for m in res.fresh.margins)
        verdict = "a tie within one seed's noise: either fleet will do" if res.fresh.tie else "ahead on every seed"
        out.write(f"on fresh seeds {res.fresh.seeds}: {margins} over the same homogeneous fleet, {verdict}\n")
    out.write(f"{'phase':12s} {'winner':>10s} {'homog.':>10s} {'ratio':>6s}\n")
    for name, p in win.phases.items():
        h = hom.phases[name]
        out.write(f"{name:12s} {p.score:10.2f} {h.score:10.2f} {p.score / h.score if h.score else 0:6.2f}\n")
    if res.reshape is not None:
        out.write(f"\nover the day: {res.reshape.advice}\n")
        for sw in res.reshape.switches:
            out.write(
                f"  {sw.before} -> {sw.after}: {sw.fleet}, {sw.servers_restarted} server(s) restarted, "
                f"{sw.downtime_s / 60:.0f} min of reduced capacity\n"
            )
    if res.exhaustive_best is not None and res.exhaustive is not None:
        e, x = res.exhaustive_best, res.exhaustive
        out.write(
            f"\nexhaustive search ({res.compositions} compositions): best {e.fleet} with {e.policy} "
            f"{e.score:.2f} on seed {res.seed}; on fresh seeds {x.seeds} the leaders and the pick score "
            + ", ".join(f"{k} {v:.2f}" for k, v in x.leaders.items())
            + f": the plan's pick {x.pick} is {_pct(x.gap)} from the best ({x.best}), "
            f"{'within' if x.gap >= -0.03 else 'NOT within'} 3%\n"
        )
    out.write("\nassumed:\n" + "".join(f"  - {a}\n" for a in res.assumptions))


def main(argv: list[str]) -> int:
    ap = parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)

    def fail(msg: str) -> int:
        print(f"specroute plan: {msg}", file=sys.stderr)
        return 2

    if not 1 <= args.servers <= MAX_SERVERS:
        return fail(f"--servers {args.servers}: a fleet needs between 1 and {MAX_SERVERS} servers")
    if not args.restart_min >= 0 or not 10 <= args.sample_s <= 3600 or args.shortlist < 1:
        return fail("--restart-min must be >= 0, --sample-s within [10, 3600], --shortlist >= 1")
    is_trace = args.traffic.startswith(TRACE_PREFIX)
    if not is_trace and (trace_flags_given(args) or args.thinking_share is not None):
        return fail("the trace options (--trace-*, --thinking-*) need --traffic trace:PATH")
    if is_trace and args.verify:
        return fail(
            "--verify replays one phase of single requests over HTTP; a trace's HTTP replay is loadgen's "
            "(loadgen --dataset trace:PATH against the fleet)"
        )
    try:
        slo = parse_slo(args.slo) if args.slo is not None else DEFAULT_SLO
        traffic = load_traffic(args.traffic, trace_options(args) if is_trace else None)
        if args.profiles is not None and args.types is not None:
            return fail("give --types or --profiles, not both")
        if args.profiles is not None:
            from evaluate.server_types import profile_types, with_reference

            types = profile_types(args.profiles)
            traffic = msgspec.structs.replace(traffic, scenario=with_reference(traffic.scenario, types, args.reference))
        else:
            types = [t for t in (args.types or ",".join(DEFAULT_TYPES)).split(",") if t.strip()]
            if args.reference is not None:
                from evaluate.server_types import with_reference

                traffic = msgspec.structs.replace(
                    traffic, scenario=with_reference(traffic.scenario, types, args.reference)
                )

        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)

        t0 = time.perf_counter()
        res = plan(
            args.servers,
            traffic,
            slo=slo,
            types=types,
            objective="goodput" if args.slo is not None else "tok_s",
            shortlist=args.shortlist,
            sample_s=args.sample_s,
            seed=args.seed,
            seeds=args.seeds,
            restart_s=args.restart_min * 60,
            exhaustive=args.exhaustive,
            jobs=args.jobs,
            log=log,
        )
    except (SloError, TrafficError, FleetError, TraceError) as e:
        return fail(str(e))
    print_plan(res, sys.stdout)
    status = 0
    if args.verify:
        from evaluate.plan_verify import print_verify, verify

        try:
            check = verify(
                res,
                traffic,
                time_scale=args.verify_time_scale,
                seed=args.seed,
                output=args.output or Path("out/plan-verify"),
                log=log,
            )
        except (RuntimeError, OSError) as e:
            print(f"specroute plan: --verify failed: {e}", file=sys.stderr)
            return 1
        print_verify(check, sys.stdout)
        status = 0 if check.agrees else 1
        if args.output is not None:
            _write_json(args.output / "verify.json", check)
    if args.output is not None:
        _write_json(args.output / "plan.json", res)
        print(f"wrote {args.output / 'plan.json'} ({time.perf_counter() - t0:.0f} s)")
    return status


def _span(seconds: float) -> str:
    """How long a phase stands for: hours, or minutes below one."""
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds / 60:.3g} min"


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(value), indent=1) + b"\n")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
