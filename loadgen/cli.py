"""`loadgen` command line.

    loadgen --target gateway --concurrency 32
    loadgen --target gateway,k26-ar,http://127.0.0.1:30000 --concurrency 1,4,32 \\
            --max-tokens 256 --num-prompts 64 --dataset mixed --output out/sweep
    loadgen --target gateway --request-rate 4 --concurrency 32 --duration 60
    loadgen --target gateway --dataset trace:mooncake.jsonl --trace-window 600:600 --trace-speedup 1.5
    loadgen compare A/summary.json B/summary.json
    loadgen study k26-ar-sweep [--output DIR] [--quick | --time-scale F] [--target URL,...]

Bad input (unreachable target, wrong key, unknown dataset, malformed file) ends with one line
on stderr and a non-zero exit, never a traceback; finished levels are already on disk.
Exit codes: 0 all targets ran, 1 a target failed, 2 bad command line or dataset, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from pathlib import Path

import msgspec
from rich.console import Console

from common.output_dir import output_dir
from common.priority import priority_in_range
from common.version import package_version
from loadgen.client import ENDPOINTS, RequestOptions
from loadgen.datasets import DATASET_HELP, Dataset, DatasetError, RandomSpec, load_dataset
from loadgen.driver import LevelSpec
from loadgen.metrics import GOODPUT_METRICS
from loadgen.report import make_console
from loadgen.runner import Plan, execute
from loadgen.trace_args import add_trace_arguments, check_share, trace_flags_given, trace_options
from loadgen.trace_file import TraceError

DEFAULT_GATEWAY = "http://127.0.0.1:8000"


class UsageError(Exception):
    """A command-line value is wrong; one line for the user."""


def _concurrency_list(text: str) -> list[int | None]:
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("inf", "0", "none"):
            out.append(None)
            continue
        try:
            c = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a concurrency: {part!r}") from None
        if c < 1:
            raise argparse.ArgumentTypeError(f"concurrency must be >= 1: {c}")
        out.append(c)
    return out


def _rate_list(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            r = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a request rate: {part!r}") from None
        if not r > 0:
            raise argparse.ArgumentTypeError(f"request rate must be > 0: {part}")
        out.append(r)
    return out


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {v}")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text) if text.lstrip("-").isdigit() else -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0: {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0: {text}")
    return v


def _temperature_list(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            t = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a temperature: {part!r}") from None
        if not 0.0 <= t <= 2.0:
            raise argparse.ArgumentTypeError(f"temperature must be within [0, 2]: {part}")
        out.append(t)
    return out


def _priority_list(text: str) -> list[int]:
    out = []
    where = f" (in {text!r})" if "," in text else ""  # an empty part names nothing by itself
    for part in text.split(","):
        # digits only: int() would also take "1_0" or " 5 ", which SGLang's JSON field would not
        digits = part[1:] if part[:1] in ("+", "-") else part
        if not (digits.isascii() and digits.isdigit()):
            raise argparse.ArgumentTypeError(f"not an integer priority: {part!r}{where}")
        p = int(part)
        if not priority_in_range(p):
            raise argparse.ArgumentTypeError(f"priority must be a signed 64-bit integer: {part}{where}")
        out.append(p)
    return out


def _top_p(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"top_p must be within (0, 1]: {text}")
    return v


def _goodput_slos(text: str) -> dict[str, float]:
    """`ttft=S,tpot=S,e2el=S` (seconds; any of the three) -> SLOs in ms, SGLang's unit."""
    slos: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in GOODPUT_METRICS:
            raise argparse.ArgumentTypeError(
                f"expected NAME=SECONDS with NAME in {', '.join(GOODPUT_METRICS)}, got {part.strip()!r}"
            )
        if name in slos:
            raise argparse.ArgumentTypeError(f"{name} is given twice")
        try:
            seconds = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: not a number of seconds: {value!r}") from None
        if not 0 < seconds < math.inf:
            raise argparse.ArgumentTypeError(f"{name}: expected seconds > 0, got {value}")
        slos[name] = seconds * 1000
    return slos


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadgen",
        description="Load generator for OpenAI-compatible targets (specroute gateway, SGLang "
        "servers). Subcommands: 'loadgen compare A B', 'loadgen study NAME' "
        "(see 'loadgen study --help').",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument(
        "--target",
        default="gateway",
        help="comma-separated: 'gateway', a backend name of the gateway's topology, "
        "or a URL; run one after the other (default: gateway)",
    )
    p.add_argument(
        "--gateway-url",
        default=os.environ.get("SPECROUTE_GATEWAY_URL", DEFAULT_GATEWAY),
        help=f"gateway base URL (default {DEFAULT_GATEWAY})",
    )
    p.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=None,
        help="comma-separated levels, e.g. 1,4,32: requests in flight (closed loop), "
        "or the cap with --request-rate or a trace ('inf', 'none' or 0 = uncapped) (default 1; a trace: uncapped)",
    )
    p.add_argument(
        "--request-rate",
        type=_rate_list,
        default=None,
        help="open loop: Poisson arrivals per second (comma-separated list allowed)",
    )
    p.add_argument("--dataset", default="mixed", help=f"{DATASET_HELP} (default mixed)")
    p.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="output tokens per request (default 256; a trace gives its own)",
    )
    p.add_argument(
        "--num-prompts",
        type=_positive_int,
        default=None,
        help="requests per level, sessions for session datasets (default 2 x concurrency, 64 when uncapped)",
    )
    p.add_argument(
        "--duration",
        type=_positive_float,
        default=None,
        help="seconds per level: issue requests until then instead of --num-prompts",
    )
    p.add_argument(
        "--warmup",
        type=_nonneg_int,
        default=0,
        help="requests per level sent first at the level's concurrency, not measured",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and random prompts")
    p.add_argument("--model", default=None, help="model name to request (default: the backend's, else /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default $OPENAI_API_KEY)")
    p.add_argument(
        "--output", type=output_dir, default=None, help="directory for summary.json, summary.csv, requests.jsonl, plots"
    )
    p.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=True, help="stream responses (default on)"
    )
    p.add_argument(
        "--spec-details",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for sglext spec_tokens_details to measure accept length (default on)",
    )
    p.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="generate exactly max-tokens like bench_serving (default on, except for requests that offer "
        "tools: a tool call needs the model to stop)",
    )
    p.add_argument(
        "--continuous-usage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for stream_options.continuous_usage_stats: usage on every chunk, exact tokens per chunk "
        "for per-token ITL (default on; without it ITL splits tokens by text length)",
    )
    p.add_argument(
        "--save-chunks",
        action="store_true",
        help="requests.jsonl: each generated chunk's arrival (ms after the send) and tokens (chunk_times_ms, "
        "chunk_tokens), like bench_serving's per-request itls",
    )
    p.add_argument(
        "--thinking",
        choices=("default", "on", "off", "mix"),
        default="default",
        help="chat_template_kwargs.thinking: on, off, mix (alternating by request, or by session), or "
        "default (send nothing: the server's template decides); a dataset line's 'thinking' wins",
    )
    p.add_argument(
        "--max-turns",
        type=_positive_int,
        default=None,
        help="session datasets: replay at most this many user turns of each conversation",
    )
    p.add_argument(
        "--think-time",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="session datasets: mean seconds between an answer and the next turn, a user's reading and "
        "typing (exponential, seeded by --seed and the session; default 0: at once)",
    )
    p.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="chat",
        help="OpenAI route to load: chat (/v1/chat/completions, the default), completions (/v1/completions), "
        "responses (/v1/responses: max_output_tokens = --max-tokens + 2, SGLang's headroom; no spec details, "
        "ignore_eos or per-chunk usage there)",
    )
    p.add_argument(
        "--chain-responses",
        action="store_true",
        help="--endpoint responses with a session dataset: keep each conversation on the server (store: true; "
        "turns after the first send previous_response_id and only the new user message); needs the server's "
        "--enable-response-store",
    )
    p.add_argument(
        "--temperature",
        type=_temperature_list,
        default=None,
        help="sampling temperature, or a comma-separated mix taken in turn by request (by session for "
        "session datasets), e.g. 0,0.6,1.0 (default 0); a dataset line's 'temperature' wins",
    )
    p.add_argument("--top-p", type=_top_p, default=None, help="top_p to send (default: none sent)")
    p.add_argument(
        "--priority",
        type=_priority_list,
        default=None,
        help="SGLang's scheduling 'priority' (an integer; the gateway's queue and SGLang's "
        "--enable-priority-scheduling serve higher values first), or a comma-separated mix taken in turn by "
        "request (by session for session datasets), e.g. 0,0,0,10; the summary breaks latency down by "
        "priority (default: none sent); a dataset line's 'priority' wins",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds without data before a request counts as timed out",
    )
    p.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        metavar="F",
        help="the targets run F x real time (twins started with --time-scale F): a trace's arrivals are sent F x "
        "their offsets apart and every figure is converted back to the targets' simulated time (default 1)",
    )
    add_trace_arguments(p)
    p.add_argument("--random-input-len", type=_positive_int, default=256)
    p.add_argument("--random-output-len", type=_positive_int, default=256)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live progress (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--goodput",
        type=_goodput_slos,
        default=None,
        metavar="ttft=S,tpot=S,e2el=S",
        help="SLOs in seconds (any of the three): report SLO goodput as SGLang's bench_serving --goodput "
        "defines it, the requests that succeeded and met every SLO per second of the level, and the share "
        "of requests that did (summary.json: goodput)",
    )
    p.add_argument(
        "--plots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write PNG plots into --output (needs matplotlib)",
    )
    return p


def _check_generated_args(args: argparse.Namespace, trace: bool) -> None:
    """A trace sets arrivals, lengths and sampling itself, the agentic shape lengths and sampling:
    the options that would set them are refused."""
    given = {
        "--request-rate": trace and args.request_rate is not None,
        "--max-tokens": args.max_tokens is not None,
        "--thinking": args.thinking != "default",
        "--temperature": args.temperature is not None,
        "--top-p": args.top_p is not None,
        "--warmup": args.warmup > 0,
        "--think-time": args.think_time > 0,
        f"--endpoint {args.endpoint}": args.endpoint != "chat",  # thinking is a chat template's switch
        "--chain-responses": args.chain_responses,
    }
    clash = [k for k, v in given.items() if v]
    if clash:
        what = "a trace: the trace sets arrivals and lengths" if trace else "--dataset agentic: the shape sets lengths"
        raise UsageError(f"{clash[0]} with {what}, K2.6's settings the sampling (--thinking-share, --thinking-scale)")


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Validate combinations argparse cannot see and build the plan."""
    is_trace = args.dataset.startswith("trace:")
    is_agentic = args.dataset == "agentic"
    trace_only = [f for f in trace_flags_given(args) if not (is_agentic and f == "--thinking-scale")]
    if is_trace or is_agentic:
        _check_generated_args(args, is_trace)
    if trace_only and not is_trace:
        raise UsageError(f"{trace_only[0]} needs --dataset trace:PATH")
    if args.thinking_share is not None and (
        args.thinking != "default" or args.temperature is not None or args.top_p is not None
    ):
        raise UsageError("--thinking-share sets thinking, temperature and top_p (K2.6's settings): not with those")
    if args.concurrency is None:
        args.concurrency = [None] if is_trace else [1]
    rates: list[float | None] = list(args.request_rate) if args.request_rate else [None]
    if args.request_rate is None and None in args.concurrency and not is_trace:
        raise UsageError("--concurrency inf needs --request-rate (closed loop needs a number)")
    if args.duration is not None and any(math.isinf(r) for r in rates if r is not None):
        raise UsageError("--duration needs a finite --request-rate")
    if args.endpoint == "responses" and args.ignore_eos:
        raise UsageError("--ignore-eos: SGLang's /v1/responses has no ignore_eos (--endpoint responses)")
    if args.chain_responses and args.endpoint != "responses":
        raise UsageError("--chain-responses needs --endpoint responses (previous_response_id is a Responses API field)")
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    if not targets:
        raise UsageError("--target is empty")
    random_spec = RandomSpec(
        args.random_input_len,
        args.random_output_len,
        args.random_range_ratio,
        max(args.num_prompts or 0, 2 * max((c or 32) for c in args.concurrency)),
    )
    try:
        check_share(args.thinking_share)
        trace = trace_options(args) if is_trace or is_agentic else None
    except TraceError as e:
        raise UsageError(str(e)) from None
    dataset = load_dataset(
        args.dataset, seed=args.seed, random_spec=random_spec, max_turns=args.max_turns, trace_options=trace
    )
    if args.think_time and not dataset.is_sessions:
        raise UsageError("--think-time needs a session dataset (--dataset sessions or sessions:FILE)")
    if args.chain_responses and not dataset.is_sessions:
        raise UsageError("--chain-responses needs a session dataset (--dataset sessions or sessions:FILE)")
    levels = [
        LevelSpec(
            concurrency=c,
            request_rate=r,
            num_prompts=_num_prompts(args.num_prompts, c, dataset),
            duration=args.duration,
            warmup=args.warmup,
            time_scale=args.time_scale,
        )
        for c in args.concurrency
        for r in rates
    ]
    temperatures = args.temperature or [0.0]
    opts = RequestOptions(
        max_tokens=args.max_tokens or 256,
        endpoint=args.endpoint,
        stream=args.stream,
        spec_details=args.spec_details,
        ignore_eos=args.ignore_eos,
        temperature=temperatures[0],
        temperatures=tuple(temperatures),
        top_p=args.top_p,
        priorities=tuple(args.priority or ()),
        thinking=args.thinking,
        continuous_usage=args.continuous_usage,
        save_chunks=args.save_chunks,
        api_key=args.api_key,
        timeout=args.timeout,
        chain_responses=args.chain_responses,
        think_time_s=args.think_time,
        thinking_share=args.thinking_share,
        seed=args.seed,
    )
    return Plan(
        targets=targets,
        gateway_url=args.gateway_url,
        model=args.model,
        dataset=dataset,
        levels=levels,
        opts=opts,
        seed=args.seed,
        output=args.output,
        progress=args.progress,
        goodput_slos_ms=args.goodput or {},
        time_scale=args.time_scale,
    )


def _num_prompts(given: int | None, concurrency: int | None, dataset: Dataset) -> int:
    """Requests (sessions) per level: as given; else a trace's window, 2 x C, or 64 when uncapped."""
    if given:
        return min(given, len(dataset.trace)) if dataset.trace is not None else given
    if dataset.trace is not None:
        return len(dataset.trace)
    return 2 * concurrency if concurrency else 64


def _err(msg: str) -> None:
    print(f"loadgen: error: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "compare":
            return _compare(argv[1:])
        if argv and argv[0] == "study":
            from loadgen.study import main as study_main

            return study_main(argv[1:])
        return _run(argv)
    except KeyboardInterrupt:
        _err("interrupted; finished levels are in the output directory, if any")
        return 130
    except Exception as e:  # the promise is no traceback; LOADGEN_DEBUG=1 shows it
        if os.environ.get("LOADGEN_DEBUG"):
            raise
        _err(f"internal error: {type(e).__name__}: {e}")
        return 1


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = plan_from_args(args)
    except (UsageError, DatasetError) as e:
        _err(str(e))
        return 2
    console = make_console()
    summary, errors = _run_loop(plan, console)
    if summary.runs and any(r.levels for r in summary.runs):
        from loadgen.report import print_table

        console.print()
        print_table(summary, console)
    if plan.output is not None and args.plots and any(r.levels for r in summary.runs):
        _plots(summary, plan.output)
    for message in errors:
        _err(message)
    return 1 if errors else 0


def _run_loop(plan: Plan, console: Console):
    try:
        import uvloop  # optional: a faster event loop (installed with uvicorn[standard])
    except ImportError:
        return asyncio.run(execute(plan, console))
    return uvloop.run(execute(plan, console))


def _plots(summary, output: Path) -> None:
    try:
        from loadgen.plots import write_plots
    except ImportError as e:
        print(f"loadgen: plots skipped ({e})", file=sys.stderr)
        return
    write_plots(summary, output)


def _compare(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="loadgen compare", description="Print B / A ratios of two summary.json files.")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = p.parse_args(argv)
    from loadgen.report import compare
    from loadgen.summary import load_summary

    try:
        a, b = load_summary(args.a), load_summary(args.b)
    except (OSError, ValueError, msgspec.DecodeError) as e:
        _err(f"cannot read summary: {e}")
        return 2
    rows = compare(a, b)
    if not rows:
        _err("no common target and level in the two summaries")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
