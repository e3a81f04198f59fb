"""Converting results measured against time-scaled twins back to simulated (real-hardware) time.

A twin started with `--time-scale F` multiplies every simulated duration by F: a 19.6 s batch
takes 19.6 x F seconds of wall time. Figures measured on the wall clock are converted back with
one rule per kind of unit, and every field of the result schema is classified here explicitly:

- durations (s, ms): simulated = measured / F      (`TIME_FIELDS`)
- rates (tok/s, req/s): simulated = measured x F   (`RATE_FIELDS`)
- counts and ratios (tokens, requests, accept length, tokens per chunk): unchanged
  (`UNSCALED_FIELDS`)
- a level's per-turn and per-priority figures (`turns`, `by_priority`: lists of `TurnLevel`,
  `PriorityLevel`) element by element, and its SLO goodput (`goodput`: a `Goodput` or None), by
  their own class's sets (`LEVEL_NESTED_FIELDS`); a dict of durations has each value converted

A field missing from every set of its class, or in more than one, is an error (a test checks it),
so a field added to the schema later cannot silently keep wall-clock units. Client-side overhead
(HTTP, event loop) is divided by F as well: the smaller F, the more it weighs in the simulated
figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import msgspec

from loadgen.summary import Goodput, Level, PriorityLevel, RequestRecord, TurnLevel

if TYPE_CHECKING:
    from loadgen.driver import LevelResult

LEVEL_TIME_FIELDS = frozenset(
    {
        "duration",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_itl_ms",
        "mean_e2e_latency_ms",
        "mean_ttft_ms",
        "p90_ttft_ms",
        "median_tpot_ms",
        "p90_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "p90_itl_ms",
        "p99_itl_ms",
        "median_e2e_latency_ms",
        "p90_e2e_latency_ms",
        "p99_e2e_latency_ms",
        "median_ttft_answer_ms",
        "p90_ttft_answer_ms",
        "p99_ttft_answer_ms",
        "mean_ttft_answer_ms",
        "median_ttft_reasoning_ms",
        "mean_client_wait_ms",
        "p99_client_wait_ms",
        "trace_lateness_p50_ms",
        "trace_lateness_p99_ms",
        "trace_lateness_max_ms",
    }
)
LEVEL_RATE_FIELDS = frozenset(
    {
        "output_throughput",
        "request_throughput",
        "mean_request_output_throughput",
        "median_request_output_throughput",
        "mean_decode_throughput",
        "request_rate",  # arrivals per second of an open-loop level
    }
)
LEVEL_UNSCALED_FIELDS = frozenset(
    {
        "max_concurrency",
        "completed",
        "failed",
        "total_output_tokens",
        "accept_length",
        "backends",
        "mode",
        "total_input_tokens",
        "errors",
        "token_count_mismatches",
        "mean_tokens_per_chunk",
        "domains",
        "accept_length_by_domain",
        "total_reasoning_tokens",
        "reasoning_requests",
        "total_cached_tokens",
        "cache_hit_rate",
        "itl_token_counts",
        "itl_exact_requests",
        "finish_reasons",
        "tool_call_requests",
        "thinking",
        "temperatures",
        "priorities",
        "sessions",
        "trace_requests",
        "trace_on_time",  # judged on the wall clock the sends kept (a ratio)
    }
)
# Structs (or lists of them) holding durations and rates of their own: rescaled by their class's sets.
LEVEL_NESTED_FIELDS = frozenset({"turns", "by_priority", "goodput"})
TURN_TIME_FIELDS = frozenset({"median_ttft_ms", "median_ttft_answer_ms", "median_e2e_latency_ms"})
TURN_UNSCALED_FIELDS = frozenset(
    {"turn", "completed", "failed", "mean_input_tokens", "mean_cached_tokens", "cache_hit_rate"}
)
PRIORITY_TIME_FIELDS = frozenset({"median_ttft_ms", "p99_ttft_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms"})
PRIORITY_RATE_FIELDS = frozenset({"mean_request_output_throughput"})
PRIORITY_UNSCALED_FIELDS = frozenset({"priority", "completed", "failed", "errors"})
# The SLOs are durations (judged on the wall clock against limits x F, so / F gives the ones asked for).
GOODPUT_TIME_FIELDS = frozenset({"goodput_slos_ms"})
GOODPUT_RATE_FIELDS = frozenset({"request_goodput"})
GOODPUT_UNSCALED_FIELDS = frozenset({"slo_attainment", "slo_attainment_by_metric"})

RECORD_TIME_FIELDS = frozenset(
    {
        "start_s",
        "client_wait_ms",
        "scheduled_s",
        "ttft_ms",
        "e2e_ms",
        "tpot_ms",
        "itl_mean_ms",
        "itl_max_ms",
        "ttft_reasoning_ms",
        "ttft_answer_ms",
        "chunk_times_ms",  # a list: each element rescaled
    }
)
RECORD_RATE_FIELDS = frozenset({"output_throughput", "decode_throughput", "request_rate"})
RECORD_UNSCALED_FIELDS = frozenset(
    {
        "index",
        "target",
        "trace_line",
        "max_concurrency",
        "domain",
        "ok",
        "error",
        "error_detail",
        "status",
        "backend",
        "request_id",
        "trace_id",
        "finish_reason",
        "input_tokens",
        "output_tokens",
        "output_tokens_source",
        "client_chunks",
        "token_mismatch",
        "spec_verify_ct",
        "accept_length",
        "session",
        "turn",
        "response_id",
        "previous_response_id",
        "thinking",
        "temperature",
        "priority",
        "tools",
        "tool_calls",
        "reasoning_tokens",
        "cached_tokens",
        "itl_token_counts",
        "chunk_tokens",
    }
)

_NONE: frozenset[str] = frozenset()
# time, rate, unscaled, nested
_CLASSES: dict[type, tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]] = {
    Level: (LEVEL_TIME_FIELDS, LEVEL_RATE_FIELDS, LEVEL_UNSCALED_FIELDS, LEVEL_NESTED_FIELDS),
    RequestRecord: (RECORD_TIME_FIELDS, RECORD_RATE_FIELDS, RECORD_UNSCALED_FIELDS, _NONE),
    TurnLevel: (TURN_TIME_FIELDS, _NONE, TURN_UNSCALED_FIELDS, _NONE),
    PriorityLevel: (PRIORITY_TIME_FIELDS, PRIORITY_RATE_FIELDS, PRIORITY_UNSCALED_FIELDS, _NONE),
    Goodput: (GOODPUT_TIME_FIELDS, GOODPUT_RATE_FIELDS, GOODPUT_UNSCALED_FIELDS, _NONE),
}

T = TypeVar("T", Level, RequestRecord, TurnLevel, PriorityLevel, Goodput)


def unclassified(cls: type[msgspec.Struct]) -> set[str]:
    """Fields of `cls` in none of its sets, or in more than one (must be empty)."""
    sets = _CLASSES[cls]
    fields = {f.name for f in msgspec.structs.fields(cls)}
    counts = {f: sum(f in s for s in sets) for f in fields}
    stale = frozenset().union(*sets) - fields
    return {f for f, n in counts.items() if n != 1} | stale


def rescale(obj: T, time_scale: float) -> T:
    """`obj` with wall-clock figures converted to simulated time (see the module docstring)."""
    if time_scale == 1.0:
        return obj
    if not time_scale > 0:
        raise ValueError(f"time scale must be > 0: {time_scale}")
    time_f, rate_f, _, nested_f = _CLASSES[type(obj)]
    changes: dict[str, object] = {}
    for name in nested_f:
        v = getattr(obj, name)
        if isinstance(v, list):
            changes[name] = [rescale(x, time_scale) for x in v]
        elif v is not None:
            changes[name] = rescale(v, time_scale)
    for name in time_f:
        v = getattr(obj, name)
        if isinstance(v, list):
            changes[name] = [x / time_scale for x in v]
        elif isinstance(v, dict):
            changes[name] = {k: x / time_scale for k, x in v.items()}
        elif v is not None:
            changes[name] = v / time_scale
    for name in rate_f:
        v = getattr(obj, name)
        if v is not None:
            changes[name] = v * time_scale
    return msgspec.structs.replace(obj, **changes)


def to_simulated(result: LevelResult, time_scale: float) -> LevelResult:
    """A driver `LevelResult` (level + records) converted to simulated time."""
    return type(result)(rescale(result.level, time_scale), [rescale(r, time_scale) for r in result.records])
