"""The result schema: one line per request (`RequestRecord`) and `summary.json` (`Summary`).

`summary.json` follows `docs/metrics.md`; the fields it lists come first and keep their names (SGLang's
`bench_serving` names where the meaning is the same). Fields after them are additions: readers
of the original schema can ignore them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request as `requests.jsonl` stores it. Times in ms unless named otherwise."""

    index: int
    target: str
    max_concurrency: int | None
    request_rate: float | None
    domain: str
    start_s: float  # when it was sent, seconds after the level started
    # Open loop with a concurrency cap: how long its arrival waited for a free slot before it was
    # sent (latencies count from the send, as SGLang's bench_serving does); None otherwise.
    client_wait_ms: float | None = None
    # Trace replay: when the trace had it due (seconds after the level started; start_s - scheduled_s
    # is how late it went) and its line in the trace file
    scheduled_s: float | None = None
    trace_line: int | None = None
    ok: bool
    error: str | None = None  # kind: http_<status> | timeout | connect | stream_error | broken_stream | bad_response
    error_detail: str | None = None
    status: int | None = None
    backend: str | None = None  # x-specroute-backend response header
    request_id: str | None = None  # x-request-id response header (the gateway's access log has it)
    trace_id: str | None = None  # x-specroute-trace-id: the request's trace, when the gateway recorded one
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int = 0  # the server's usage.completion_tokens; the client count without usage
    output_tokens_source: str = "usage"  # usage | client
    client_chunks: int = 0  # content-bearing chunks the client received (each holds >= 1 token)
    token_mismatch: str | None = None  # why client and server counts disagree, when they do
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    itl_mean_ms: float | None = None
    itl_max_ms: float | None = None
    output_throughput: float | None = None  # output_tokens / e2e (tok/s)
    decode_throughput: float | None = None  # (output_tokens - 1) / (last - first content) (tok/s)
    spec_verify_ct: int | None = None
    accept_length: float | None = None  # output_tokens / spec_verify_ct
    # --- thinking, tools, sessions (see docs/metrics.md) ---
    session: int | None = None  # index of the conversation a turn belongs to (session datasets)
    turn: int | None = None  # 0-based turn within its session
    # --chain-responses: this turn's response id, and the previous turn's it was chained to (None on
    # turn 0: sent whole); a chained turn's input is only its new user message
    response_id: str | None = None
    previous_response_id: str | None = None
    thinking: bool | None = None  # chat_template_kwargs.thinking sent; None: the server's default
    temperature: float | None = None  # sent with this request
    priority: int | None = None  # SGLang's `priority` sent with this request; None: not sent
    tools: int = 0  # tools offered in the request
    tool_calls: int = 0  # tool calls in the answer
    ttft_reasoning_ms: float | None = None  # send -> first reasoning_content
    ttft_answer_ms: float | None = None  # send -> first answer token (content, tool call, text)
    reasoning_tokens: int | None = None  # server usage (reasoning_tokens), when reported
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    itl_token_counts: str | None = None  # usage (exact, continuous usage) | text_length (fallback split)
    # --save-chunks: per generated chunk, its arrival (ms after the send) and the tokens counted in it
    chunk_times_ms: list[float] | None = None
    chunk_tokens: list[int] | None = None


class TurnLevel(msgspec.Struct, kw_only=True):
    """The requests of one turn index across the sessions of a level (turn 0 = first user turn)."""

    turn: int
    completed: int
    failed: int
    median_ttft_ms: float | None = None
    median_ttft_answer_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    mean_input_tokens: float | None = None
    mean_cached_tokens: float | None = None  # over the requests that reported cached tokens
    cache_hit_rate: float | None = None  # sum(cached) / sum(input) over the same requests


class PriorityLevel(msgspec.Struct, kw_only=True):
    """The requests of one `priority` value of a level, by the level's own definitions: what a
    priority class gets under load (queue order at the gateway and at SGLang)."""

    priority: int
    completed: int
    failed: int
    errors: dict[str, int] = {}  # failures by kind, as Level.errors
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    mean_request_output_throughput: float | None = None  # tok/s, over requests' output_throughput


class Goodput(msgspec.Struct, kw_only=True):
    """SLO goodput, as SGLang's `bench_serving --goodput` defines it (`sglang/benchmark/goodput.py`,
    0.5.23) and with its result-file names: a request is good when it succeeded and met every SLO
    given (TTFT, TPOT, E2E latency: each at most its limit)."""

    goodput_slos_ms: dict[str, float]  # the SLOs: ttft, tpot, e2el (ms)
    request_goodput: float  # good requests per second of the level's wall time
    slo_attainment: float  # good requests / requests sent (failed ones included)
    slo_attainment_by_metric: dict[str, float]  # per SLO: requests that succeeded and met it / requests sent


class Level(msgspec.Struct, kw_only=True):
    """One load level of one target. Latencies in ms, throughputs in tok/s or req/s."""

    max_concurrency: int | None
    completed: int
    failed: int
    duration: float
    total_output_tokens: int
    output_throughput: float
    request_throughput: float
    mean_request_output_throughput: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_itl_ms: float | None
    mean_e2e_latency_ms: float | None
    accept_length: float | None
    backends: dict[str, int]
    # --- additions to the original schema ---
    mode: str = "closed"  # closed | open
    request_rate: float | None = None
    # Open loop with a cap: arrivals' waits for a free slot, which no latency above includes
    mean_client_wait_ms: float | None = None
    p99_client_wait_ms: float | None = None
    total_input_tokens: int = 0
    median_request_output_throughput: float | None = None
    mean_decode_throughput: float | None = None
    mean_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    p90_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    errors: dict[str, int] = {}
    token_count_mismatches: int = 0
    mean_tokens_per_chunk: float | None = None
    domains: dict[str, int] = {}
    accept_length_by_domain: dict[str, float] = {}  # as accept_length, per prompt domain
    # --- thinking, tools and sessions (docs/metrics.md) ---
    median_ttft_answer_ms: float | None = None  # send -> first answer token (not reasoning)
    p90_ttft_answer_ms: float | None = None
    p99_ttft_answer_ms: float | None = None
    mean_ttft_answer_ms: float | None = None
    median_ttft_reasoning_ms: float | None = None  # over requests that streamed reasoning
    total_reasoning_tokens: int = 0
    reasoning_requests: int = 0  # successful requests with reasoning tokens > 0
    total_cached_tokens: int | None = None  # None: no request reported cached tokens
    cache_hit_rate: float | None = None  # sum(cached) / sum(input) over requests that reported cached
    # How tokens per chunk were known for per-token ITL: "usage" (continuous usage on every
    # chunk: exact), "text_length" (the fallback split), "mixed"; None without streamed requests.
    itl_token_counts: str | None = None
    itl_exact_requests: int = 0  # successful streamed requests whose chunks all carried usage
    finish_reasons: dict[str, int] = {}
    tool_call_requests: int = 0  # successful requests whose answer called a tool
    thinking: dict[str, int] = {}  # requests by chat_template_kwargs.thinking: on | off | default
    temperatures: dict[str, int] = {}  # requests by temperature sent
    priorities: dict[str, int] = {}  # requests by priority sent (empty when none was)
    sessions: int | None = None  # conversations replayed (session datasets)
    turns: list[TurnLevel] = []  # per-turn figures of session datasets
    by_priority: list[PriorityLevel] = []  # per priority value sent, ascending (empty when none was)
    goodput: Goodput | None = None  # with `--goodput`: requests that met every SLO
    # --- trace replay (mode "trace"): how closely the sends followed the trace's arrival times ---
    trace_requests: int | None = None  # requests the trace had due (sent or not)
    trace_lateness_p50_ms: float | None = None  # send - due, over the requests sent
    trace_lateness_p99_ms: float | None = None
    trace_lateness_max_ms: float | None = None
    # share of the trace's requests sent within 2% of their due offset (at least ON_TIME_FLOOR_MS late)
    trace_on_time: float | None = None


class Run(msgspec.Struct, kw_only=True):
    """All levels of one target."""

    target: str
    url: str
    dataset: str
    levels: list[Level] = []
    model: str | None = None
    error: str | None = None  # why the run stopped early, if it did
    # Dataset entries left out when it was loaded, by reason (e.g. "no user turn": 3).
    dataset_skipped: dict[str, int] = {}
    # Set when the target ran time_scale x real time (twins with --time-scale): every figure of
    # the run is already converted back to simulated time (see timescale.py).
    time_scale: float | None = None


class Summary(msgspec.Struct, kw_only=True):
    runs: list[Run] = []


_summary_decoder = msgspec.json.Decoder(Summary)


def load_summary(source: Summary | dict[str, Any] | str | Path) -> Summary:
    """Accept a Summary, its dict form, or a path to summary.json (or to its directory)."""
    if isinstance(source, Summary):
        return source
    if isinstance(source, dict):
        return msgspec.convert(source, Summary)
    path = Path(source)
    if path.is_dir():
        path = path / "summary.json"
    return _summary_decoder.decode(path.read_bytes())


def to_builtins(summary: Summary) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(summary)
    return out
