"""The trace and K2.6 options of the command line, shared by `loadgen` and `specroute eval`/`plan`."""

from __future__ import annotations

import argparse

from loadgen.k26 import DEFAULT_THINKING_SCALE, DEFAULT_THINKING_SHARE
from loadgen.trace_dataset import TraceOptions
from loadgen.trace_file import FORMATS, TraceError, TraceSelection, parse_sample, parse_window

__all__ = ["TRACE_FLAGS", "add_trace_arguments", "trace_flags_given", "trace_options"]

# the options that only mean something for a trace
TRACE_FLAGS = ("trace_format", "trace_window", "trace_speedup", "trace_sample", "thinking_scale")


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("traces (trace:PATH) and K2.6 request settings")
    g.add_argument(
        "--trace-format",
        choices=FORMATS,
        default=None,
        help="mooncake (JSONL: timestamp ms, input_length, output_length, hash_ids), azure (CSV: "
        "TIMESTAMP,ContextTokens,GeneratedTokens), burstgpt (CSV), or auto: told by the first line (default)",
    )
    g.add_argument(
        "--trace-window",
        default=None,
        metavar="START:SECONDS",
        help="replay the trace's requests from START to START+SECONDS (trace seconds after its first request; "
        "default: all of it)",
    )
    g.add_argument(
        "--trace-speedup",
        type=float,
        default=None,
        metavar="F",
        help="replay F times faster than recorded (below 1: slower), e.g. to fit a trace of a big fleet to a few "
        "servers (default 1)",
    )
    g.add_argument(
        "--trace-sample",
        default=None,
        metavar="K:R",
        help="keep the conversations whose id is R modulo K (Mooncake: hash_ids[1], the prompt's first block "
        "after the shared one; other formats: the line): 1/K of the load with the trace's prefix reuse kept",
    )
    g.add_argument(
        "--thinking-share",
        type=float,
        default=None,
        metavar="F",
        help="K2.6's settings: a share F of requests (conversations) think at temperature 1.0, the rest answer at "
        f"0.6, top_p 0.95 (Kimi's API fixes these); default {DEFAULT_THINKING_SHARE:g} for traces and the agentic "
        "shape, none otherwise",
    )
    g.add_argument(
        "--thinking-scale",
        type=float,
        default=None,
        metavar="X",
        help="a thinking request writes X times the trace's output length (its reasoning first; default "
        f"{DEFAULT_THINKING_SCALE:g}: completions per request tripled as reasoning models took over, "
        "docs/evaluation.md)",
    )


def trace_flags_given(args: argparse.Namespace) -> list[str]:
    return ["--" + f.replace("_", "-") for f in TRACE_FLAGS if getattr(args, f, None) is not None]


def trace_options(args: argparse.Namespace) -> TraceOptions:
    """The options as a TraceOptions (defaults where not given); TraceError names a bad value."""
    window = parse_window(args.trace_window) if args.trace_window is not None else None
    sample = parse_sample(args.trace_sample) if args.trace_sample is not None else None
    selection = TraceSelection(
        format=args.trace_format or "auto",
        start_s=window[0] if window else 0.0,
        seconds=window[1] if window else None,
        speedup=args.trace_speedup if args.trace_speedup is not None else 1.0,
        sample=sample,
    )
    opts = TraceOptions(
        selection=selection,
        thinking_share=args.thinking_share if args.thinking_share is not None else DEFAULT_THINKING_SHARE,
        thinking_scale=args.thinking_scale if args.thinking_scale is not None else DEFAULT_THINKING_SCALE,
    )
    opts.validate()
    return opts


def check_share(value: float | None) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise TraceError(f"--thinking-share must be within [0, 1], got {value:g}")
