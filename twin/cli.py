"""`specroute sim`: run one twin server, list profiles, print curves, calibrate.

    specroute sim --profile NAME [--port P] [--seed S] [--time-scale F] ...
    specroute sim --list [--provenance [--profile NAME]]
    specroute sim curves [--profile NAME ...]
    specroute sim calibrate [--quick]

Argument errors are one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

import msgspec

from twin.options import LORA_TARGET_MODULES, PriorityOptions
from twin.profile import ProfileError, list_profiles, load_profile
from twin.provenance import count, is_order_deciding
from twin.provenance import table as provenance_table

__all__ = ["main"]


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting (one-line errors)."""

    def error(self, message: str) -> NoReturn:
        raise _ArgError(message)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return v


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}: {text}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}: {text}")
        return v

    return parse


def _fraction(text: str) -> float:
    v = _positive_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"must be within [0, 1]: {text}")
    return v


def _server_parser() -> _Parser:
    p = _Parser(prog="specroute sim", description="SGLang-compatible simulated server (the twin)")
    p.add_argument("--list", action="store_true", help="list the profiles and exit")
    p.add_argument(
        "--provenance",
        action="store_true",
        help="with --list: count sourced, derived and assumed parameters per profile (with --profile: each one)",
    )
    p.add_argument("--profile", help="profile name (see --list) or path to a profile .toml")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_int_at_least(0, 65535), default=30000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--enable-metrics", action="store_true", help="serve /metrics")
    p.add_argument(
        "--time-scale", type=_positive_float, default=1.0, help="multiply every simulated duration (0.02 = 50x faster)"
    )
    p.add_argument("--max-running-requests", type=_int_at_least(1))
    p.add_argument("--max-queued-requests", type=_int_at_least(0))
    p.add_argument("--served-model-name")
    p.add_argument(
        "--context-length",
        type=_int_at_least(1),
        help="the model's context length (default: the profile's, its model card's)",
    )
    p.add_argument(
        "--ddtree-budget",
        "--speculative-ddtree-budget",
        dest="ddtree_budget",
        type=_int_at_least(1),
        help="DDTree node budget (DDTree profiles only)",
    )
    p.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="native /generate streams deltas instead of cumulative text",
    )
    p.add_argument(
        "--enable-cache-report", action="store_true", help="report usage.prompt_tokens_details.cached_tokens"
    )
    p.add_argument(
        "--reasoning-parser",
        choices=["kimi_k2"],
        help="split the model's reasoning into reasoning_content (thinking profiles)",
    )
    p.add_argument("--tool-call-parser", choices=["kimi_k2"], help="parse the model's tool-call markup into tool_calls")
    p.add_argument(
        "--enable-response-store",
        action="store_true",
        help="/v1/responses: keep responses in memory (retrieve, previous_response_id, background)",
    )
    p.add_argument("--compat", choices=["0.5.9"], help="imitate an older SGLang 0.5.x (no spec details, /get_load)")
    dp = p.add_argument_group("attention data parallelism (SGLang's flags; refused: not modelled)")
    dp.add_argument("--attn-dp-size", "--attention-data-parallel-size", type=_int_at_least(1), default=1)
    dp.add_argument("--dp-size", "--data-parallel-size", type=_int_at_least(1), default=1)
    dp.add_argument("--enable-dp-attention", action="store_true", help="deprecated: --dp-size N --enable-dp-attention")
    dp.add_argument("--enable-dp-lm-head", action="store_true")
    lo = p.add_argument_group("LoRA adapters (SGLang's flags)")
    lo.add_argument("--enable-lora", action="store_true", default=None, help="implied by --lora-paths")
    lo.add_argument(
        "--lora-paths", nargs="*", metavar="ADAPTER", help='<PATH> | <NAME>=<PATH> | {"lora_name","lora_path","pinned"}'
    )
    lo.add_argument("--max-loaded-loras", type=int, metavar="N")
    lo.add_argument("--max-loras-per-batch", type=int, default=8, metavar="N")
    lo.add_argument("--max-lora-rank", type=int, metavar="R")
    lo.add_argument("--lora-target-modules", nargs="*", choices=LORA_TARGET_MODULES, metavar="MODULE")
    lo.add_argument(
        "--lora-acceptance-scale",
        type=_fraction,
        default=1.0,
        metavar="F",
        help="assumption, not an SGLang flag: adapter requests' per-draft acceptance multiplied by F",
    )
    pr = p.add_argument_group("request priority (SGLang's flags)")
    pr.add_argument(
        "--enable-priority-scheduling",
        action="store_true",
        help="schedule requests with higher priority integer values first",
    )
    pr.add_argument(
        "--schedule-low-priority-values-first",
        action="store_true",
        help="with --enable-priority-scheduling: lower priority integer values first",
    )
    pr.add_argument("--default-priority-value", type=int, help="priority of requests without one")
    pr.add_argument(
        "--abort-on-priority-when-disabled",
        action="store_true",
        help="abort requests that specify a priority when priority scheduling is disabled",
    )
    pr.add_argument("--disable-priority-preemption", action="store_true", help="no preemption of running requests")
    pr.add_argument(
        "--priority-scheduling-preemption-threshold",
        type=int,
        default=10,
        help="minimum difference in priorities for an incoming request to preempt running ones",
    )
    f = p.add_argument_group("fault knobs")
    f.add_argument("--fault-latency-ms", type=_positive_float, default=0.0)
    f.add_argument("--fault-error-rate", type=_fraction, default=0.0)
    f.add_argument("--fault-error-status", type=int, choices=(500, 502, 503, 504), default=500)
    f.add_argument("--fault-crash-after-tokens", type=_int_at_least(1))
    f.add_argument("--fault-hang-after-tokens", type=_int_at_least(1))
    f.add_argument("--fault-crash-on-prompt", metavar="TEXT", help="exit when a prompt contains TEXT")
    f.add_argument("--fault-slow-ready", type=_positive_float, default=0.0, metavar="S")
    f.add_argument("--fault-accept-drop-at", type=_positive_float, metavar="S")
    f.add_argument("--fault-accept-drop-to", type=_fraction, default=0.5, metavar="F")
    return p


def _print_list() -> int:
    for prof in list_profiles():
        print(f"{prof.name:<20} {prof.strategy.value:<7} {prof.served_model_name:<13} {prof.description}")
    return 0


def _print_provenance(name: str | None) -> int:
    """Counts per profile, or (one profile named) every parameter with its kind and experiment."""
    if name is None:
        print(provenance_table([count(p.name, p.provenance_entries()) for p in list_profiles()]))
        return 0
    try:
        prof = load_profile(name)
    except ProfileError as e:
        raise _ArgError(str(e)) from None
    for param, entry in sorted(prof.provenance_entries().items()):
        mark = "*" if is_order_deciding(param) else " "
        print(f"{mark} {param:<36} {entry.kind.value:<10} {entry.text}")
        if entry.measure:
            print(f"  {'':<36} {'measure:':<10} {entry.measure}")
    c = count(prof.name, prof.provenance_entries())
    print(
        f"{c.total} parameters: {c.sourced} sourced, {c.derived} derived, {c.assumed} assumed, {c.design} by design; "
        f"{c.order_deciding} order-deciding (*), {c.order_deciding_assumed} of them assumed"
    )
    return 0


def _attention_dp(args: argparse.Namespace, algorithm: str | None) -> None:
    """SGLang's refusals of attention data parallelism (`arg_groups/speculative_hook.py`), then the
    twin's own: it does not model DP attention at all."""
    size = args.attn_dp_size if args.attn_dp_size > 1 else args.dp_size if args.enable_dp_attention else 1
    if size <= 1:
        return
    if algorithm == "NGRAM":
        raise _ArgError("Currently ngram speculative decoding does not support dp attention.")
    if algorithm == "DFLASH" and not args.enable_dp_lm_head:
        raise _ArgError("DFLASH with dp attention requires --enable-dp-lm-head.")
    raise _ArgError("attention data parallelism is not modelled by the twin (serve with --attn-dp-size 1)")


def _priority_options(args: argparse.Namespace) -> PriorityOptions:
    """The priority flags, with SGLang's startup warnings (`arg_groups/validation_hook.py`); none of
    them stops the server. Its `schedule_policy` check has nothing to check: the twin is FCFS."""
    opts = PriorityOptions(
        enable_priority_scheduling=args.enable_priority_scheduling,
        schedule_low_priority_values_first=args.schedule_low_priority_values_first,
        default_priority_value=args.default_priority_value,
        abort_on_priority_when_disabled=args.abort_on_priority_when_disabled,
        disable_priority_preemption=args.disable_priority_preemption,
        priority_scheduling_preemption_threshold=args.priority_scheduling_preemption_threshold,
    )
    warnings: list[str] = []
    if opts.enable_priority_scheduling:
        if opts.default_priority_value is None:
            warnings.append(
                "--default-priority-value is not set while --enable-priority-scheduling is enabled. "
                "Requests without explicit priority will have priority=None, "
                "resulting in priority='None' string labels in Prometheus metrics."
            )
    else:
        if opts.disable_priority_preemption:
            warnings.append("--disable-priority-preemption has no effect without --enable-priority-scheduling")
        if opts.default_priority_value is not None:
            warnings.append("--default-priority-value has no effect without --enable-priority-scheduling")
    for text in warnings:
        print(f"specroute sim: warning: {text}", file=sys.stderr)
    return opts


def _run_server(args: argparse.Namespace) -> int:
    from twin.lora import LoraArgError, lora_options
    from twin.options import FaultOptions, ServerOptions
    from twin.server import serve

    if not args.profile:
        raise _ArgError("--profile is required (see --list)")
    try:
        profile = load_profile(args.profile)
        if args.ddtree_budget is not None:
            profile = profile.with_budget(args.ddtree_budget)
        if args.context_length is not None:
            profile = msgspec.structs.replace(profile, context_length=args.context_length)
    except ProfileError as e:
        raise _ArgError(str(e)) from None
    _attention_dp(args, profile.speculative.algorithm if profile.speculative else None)
    try:
        lora = lora_options(
            enable_lora=args.enable_lora,
            lora_paths=args.lora_paths,
            max_loaded_loras=args.max_loaded_loras,
            max_loras_per_batch=args.max_loras_per_batch,
            max_lora_rank=args.max_lora_rank,
            lora_target_modules=args.lora_target_modules,
            acceptance_scale=args.lora_acceptance_scale,
            speculative_algorithm=profile.speculative.algorithm if profile.speculative else None,
        )
    except LoraArgError as e:
        raise _ArgError(str(e)) from None
    faults = FaultOptions(
        latency_ms=args.fault_latency_ms,
        error_rate=args.fault_error_rate,
        error_status=args.fault_error_status,
        crash_after_tokens=args.fault_crash_after_tokens,
        crash_on_prompt=args.fault_crash_on_prompt,
        hang_after_tokens=args.fault_hang_after_tokens,
        slow_ready_s=args.fault_slow_ready,
        accept_drop_at_s=args.fault_accept_drop_at,
        accept_drop_to=args.fault_accept_drop_to,
    )
    options = ServerOptions(
        host=args.host,
        port=args.port,
        seed=args.seed,
        time_scale=args.time_scale,
        max_running_requests=args.max_running_requests,
        max_queued_requests=args.max_queued_requests,
        served_model_name=args.served_model_name,
        context_length=args.context_length,
        enable_metrics=args.enable_metrics,
        compat=args.compat,
        incremental_streaming_output=args.incremental_streaming_output,
        enable_cache_report=args.enable_cache_report,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        enable_response_store=args.enable_response_store,
        faults=faults,
        lora=lora,
        priority=_priority_options(args),
    )
    return serve(profile, options)


def main(argv: list[str]) -> int:
    """Entry point of `specroute sim`; returns the exit code."""
    try:
        if argv and argv[0] == "curves":
            from twin.curves import main as curves_main

            return curves_main(argv[1:])
        if argv and argv[0] == "calibrate":
            from twin.calibrate import main as calibrate_main

            return calibrate_main(argv[1:])
        args = _server_parser().parse_args(argv)
        if args.list:
            return _print_provenance(args.profile) if args.provenance else _print_list()
        if args.provenance:
            raise _ArgError("--provenance goes with --list")
        return _run_server(args)
    except _ArgError as e:
        print(f"specroute sim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
