"""Trace replay fidelity: does loadgen send a trace's requests when the trace had them?

Starts the four K2.6 twins of the evaluation's seed pool (`k26-ar`, `k26-eagle3`, `k26-dflash`,
`k26-ddtree`, each with K2.6's reasoning and tool-call parsers and `--enable-cache-report`) and
the gateway over them, replays the trace through the gateway with loadgen's real runner, and
prints how late the sends were (p50, p99, max), the share sent within 2% of their due offset
(target: 99%), what the prefix cache made of the trace's shared blocks, and how the requests
fared. Figures are in the twins' simulated time; the on-time share is judged on the wall clock the
sends kept.

    python -m loadgen.bench_trace                                   # the committed slice, real time
    python -m loadgen.bench_trace --trace PATH --trace-window 600:600 --trace-sample 4:0 --time-scale 0.5

Exit status 0 when the on-time target is met, 1 when it is not or the run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from loadgen.client import RequestOptions
from loadgen.datasets import DatasetError, load_dataset
from loadgen.driver import LevelSpec
from loadgen.metrics import ON_TIME_SHARE, TRACE_ON_TIME_TARGET
from loadgen.report import make_console, trace_note
from loadgen.runner import Plan, execute
from loadgen.trace_args import add_trace_arguments, trace_options
from loadgen.trace_file import TraceError
from loadgen.twins import start_topology
from tools.processes import ProcessError, ProcessGroup

SLICE = Path(__file__).parent / "data" / "traces" / "mooncake_conversation_head400.jsonl"
POOL = ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree")
TWIN_FLAGS = (
    "--enable-cache-report",
    "--reasoning-parser",
    "kimi_k2",
    "--tool-call-parser",
    "kimi_k2",
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadgen.bench_trace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", type=Path, default=SLICE, help="the trace to replay (default: the committed slice)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the twins run this many times real time (0.5: twice as fast); default 1",
    )
    p.add_argument("--concurrency", type=int, default=None, help="cap on requests in flight (default: none)")
    p.add_argument("--policy", default=None, help="the gateway's policy (default: its own default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=Path("out/bench-trace"))
    add_trace_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 0 < args.time_scale <= 1:
        print("bench_trace: --time-scale must be within (0, 1]", file=sys.stderr)
        return 1
    try:
        opts = trace_options(args)
        dataset = load_dataset(f"trace:{args.trace}", seed=args.seed, trace_options=opts)
    except (TraceError, DatasetError) as e:
        print(f"bench_trace: {e}", file=sys.stderr)
        return 1
    assert dataset.trace is not None
    trace = dataset.trace.trace
    console = make_console()
    sel = opts.selection
    console.print(
        f"replaying {len(trace.rows)} requests of {args.trace} ({trace.format}, window {sel.start_s:g}+"
        f"{trace.window_s:g} s, sample {sel.sample or 'all'}, speed-up {sel.speedup:g}, "
        f"{100 * opts.thinking_share:.0f}% thinking x{opts.thinking_scale:g}) through a gateway over "
        f"{', '.join(POOL)} at time scale {args.time_scale:g}: {trace.replay_s * args.time_scale:.0f} s of arrivals"
    )
    args.output.mkdir(parents=True, exist_ok=True)
    try:
        with ProcessGroup(args.output / "logs") as children:
            topo = start_topology(
                children,
                [*POOL, "gateway"],
                time_scale=args.time_scale,
                seed=args.seed,
                policy=args.policy,
                config_dir=args.output,
                twin_flags=TWIN_FLAGS,
            )
            plan = Plan(
                targets=["gateway"],
                gateway_url=topo.gateway_url or "",
                model=None,
                dataset=dataset,
                levels=[
                    LevelSpec(concurrency=args.concurrency, num_prompts=len(trace.rows), time_scale=args.time_scale)
                ],
                opts=RequestOptions(thinking_share=opts.thinking_share, seed=args.seed),
                seed=args.seed,
                output=args.output,
                progress=False,
                time_scale=args.time_scale,
            )
            summary, errors = asyncio.run(execute(plan, console))
    except ProcessError as e:
        print(f"bench_trace: {e}", file=sys.stderr)
        return 1
    for message in errors:
        print(f"bench_trace: {message}", file=sys.stderr)
    levels = [lv for run in summary.runs for lv in run.levels]
    lv = levels[0] if levels else None
    if lv is None or lv.trace_on_time is None:
        return 1
    console.print(f"\n{trace_note(lv)}")
    console.print(
        f"requests: {lv.completed} completed, {lv.failed} failed; TTFT p50 {lv.median_ttft_ms or 0:,.0f} ms, "
        f"p99 {lv.p99_ttft_ms or 0:,.0f} ms; backends {dict(sorted(lv.backends.items()))}"
    )
    met = lv.trace_on_time >= TRACE_ON_TIME_TARGET
    console.print(
        f"target: {100 * TRACE_ON_TIME_TARGET:g}% of requests within {100 * ON_TIME_SHARE:g}% of their due time: "
        + ("met" if met else "MISSED")
    )
    return 0 if met and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
