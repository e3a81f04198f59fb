"""Metric definitions: what one request measured, and what a level of requests adds up to.

docs/metrics.md has every definition; in short (names match SGLang's bench_serving where the
meanings match):

- A streamed request is timed by the shared stream clock (`common/stream_clock.py`): TTFT to the
  first generated token of any kind (reasoning, content, tool call, completions text), to the first
  reasoning and to the first answer token; decode tok/s = (n - 1) / (last - first generated chunk).
  Non-streamed requests: every first-token time = E2E (the whole answer is the first output).
- Output tokens n: the server's `usage.completion_tokens`; the client-side count (generated chunks)
  is the fallback and the cross-check. Reasoning and cached tokens come from usage too.
- TPOT = (E2E - TTFT) / (n - 1), for n > 1 and streamed requests.
- ITL per token: a chunk carrying k tokens after a gap g since the previous chunk with tokens
  contributes k samples of g/k; the first chunk adds none (its tokens are part of TTFT). k is exact
  from continuous usage (`chunk_token_counts`); without it the server's n is split over the chunks
  by text length (`apportion`), and the record says which (`itl_token_counts`). Raw chunk gaps
  would overstate ITL by the accept length under speculation. Level percentiles pool the samples.
- Aggregate output tok/s = total output tokens of successful requests / level wall time, the
  wall time running from the first send to the last response end of the level.
- Accept length = n / spec_verify_ct from `sglext.spec_tokens_details` (per request); per level,
  sum(n) / sum(spec_verify_ct) over requests that reported it; null when none did.
- Sessions: per-turn figures (`TurnLevel`) over the requests of each turn index.
- Priority classes: per-priority figures (`PriorityLevel`) over the requests sent with each
  `priority`, from the same samples (`_ttfts`, `_e2es`, `_single_throughputs`) as the level's.
- Percentiles: `common/percentile.py` (linear interpolation, numpy's default).
- SLO goodput (`--goodput`): SGLang's `bench_serving --goodput`, see `goodput`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from common.percentile import percentile, weighted_percentile
from common.stream_clock import TokenMark, chunk_token_counts
from loadgen.stream import StreamParser
from loadgen.summary import Goodput, Level, PriorityLevel, RequestRecord, TurnLevel

Gap = tuple[float, int]  # (per-token gap in seconds, number of tokens it stands for)
ON_TIME_SHARE = 0.02  # a trace's request is on time when sent within 2% of its due offset ...
ON_TIME_FLOOR_MS = 5.0  # ... or within 5 ms of it (2% of the first quarter second is below a loop tick)
TRACE_ON_TIME_TARGET = 0.99  # a replay follows its trace when this share of its requests is on time


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split `total` tokens over chunks in proportion to `weights` (text lengths), at least one
    token per chunk; rounding by largest remainder, ties to the earlier chunk. With fewer tokens
    than chunks each chunk gets one: the caller reports that as a count mismatch."""
    m = len(weights)
    if m == 0:
        return []
    if total <= m:
        return [1] * m
    ws = list(weights) if any(w > 0 for w in weights) else [1] * m
    wsum = sum(ws)
    ideal = [total * w / wsum for w in ws]
    out = [max(1, int(x)) for x in ideal]
    diff = total - sum(out)
    while diff > 0:  # hand out the rounding left-over, largest remainder first
        for i in sorted(range(m), key=lambda i: (out[i] - ideal[i], i))[:diff]:
            out[i] += 1
        diff = total - sum(out)
    while diff < 0:  # the one-token minimum overshot: take back from the most over-allocated
        for i in sorted((i for i in range(m) if out[i] > 1), key=lambda i: (ideal[i] - out[i], i))[:-diff]:
            out[i] -= 1
        diff = total - sum(out)
    return out


def chunk_tokens(chunks: Sequence[TokenMark], server_tokens: int | None) -> tuple[list[int], str]:
    """Tokens carried by each generated chunk and how they are known: "usage" (the exact counts
    of continuous usage, `common.stream_clock.chunk_token_counts`) or "text_length" (the server's
    total split by `apportion`, the fallback when some chunk came without usage)."""
    exact = chunk_token_counts(chunks)
    if exact is not None and chunks:
        return exact, "usage"
    total = server_tokens if server_tokens is not None else len(chunks)
    return apportion(total, [c.chars for c in chunks]), "text_length"


def token_gaps(chunks: Sequence[TokenMark], tokens: Sequence[int]) -> list[Gap]:
    """ITL samples of one request as (gap per token, count) pairs."""
    out: list[Gap] = []
    prev: float | None = None
    for c, k in zip(chunks, tokens, strict=True):
        if k <= 0:
            continue
        if prev is not None:
            out.append(((c.time - prev) / k, k))
        prev = c.time
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# The samples of a set of successful requests that both a level and its priority classes take
# their percentiles and means over: one definition each, so a class is the level's figure on a subset.
def _ttfts(ok: Sequence[RequestRecord]) -> list[float]:
    return [r.ttft_ms for r in ok if r.ttft_ms is not None]


def _e2es(ok: Sequence[RequestRecord]) -> list[float]:
    return [r.e2e_ms for r in ok if r.e2e_ms is not None]


def _single_throughputs(ok: Sequence[RequestRecord]) -> list[float]:
    return [r.output_throughput for r in ok if r.output_throughput is not None]


def _errors(records: Sequence[RequestRecord]) -> dict[str, int]:
    return dict(Counter(r.error for r in records if r.error))


def measure(
    parser: StreamParser,
    *,
    t_send: float,
    t_end: float,
    streamed: bool,
    record: RequestRecord,
    save_chunks: bool = False,
) -> list[Gap]:
    """Fill the timing and token fields of `record` from a finished exchange; return its ITL
    samples. Called for failed requests too (their partial figures help debugging).

    Streamed: the stream clock's figures (common/stream_clock.py), relative to `t_send`.
    Non-streamed: the whole answer arrives at the end, so every first-token time is E2E."""
    chunks = parser.chunks
    usage = parser.usage
    usage_n = usage.completion_tokens if usage is not None else None
    record.client_chunks = len(chunks)
    record.input_tokens = usage.prompt_tokens if usage is not None else None
    record.finish_reason = parser.finish_reason
    if usage_n is None:
        n = len(chunks)
        record.output_tokens_source = "client"
        if record.ok:
            record.token_mismatch = "server sent no usage"
    else:
        n = usage_n
        record.output_tokens_source = "usage"
        if record.ok:
            record.token_mismatch = _mismatch(chunks, usage_n)
    record.output_tokens = n
    if usage is not None:
        record.reasoning_tokens = usage.reasoning
        record.cached_tokens = usage.cached
    if parser.answer is not None:
        record.tool_calls = len(parser.answer.tool_calls)
    e2e = t_end - t_send
    record.e2e_ms = e2e * 1000
    if e2e > 0:
        record.output_throughput = n / e2e
    clock = parser.clock
    if chunks:
        if streamed:
            clock.t_start = t_send
            f = clock.figures(completion_tokens=n)
            record.ttft_ms = _ms(f.ttft)
            record.ttft_reasoning_ms = _ms(f.ttft_reasoning)
            record.ttft_answer_ms = _ms(f.ttft_answer)
            record.decode_throughput = f.decode_tok_s
            if n > 1 and f.ttft is not None:
                record.tpot_ms = (e2e - f.ttft) / (n - 1) * 1000
        else:
            record.ttft_ms = e2e * 1000
            if clock.t_first_reasoning is not None:
                record.ttft_reasoning_ms = e2e * 1000
            if clock.t_first_answer is not None:
                record.ttft_answer_ms = e2e * 1000
    spec = parser.spec
    if spec is not None and spec.spec_verify_ct:
        record.spec_verify_ct = spec.spec_verify_ct
        record.accept_length = n / spec.spec_verify_ct
    if not streamed:
        return []
    tokens, source = chunk_tokens(chunks, usage_n)
    record.itl_token_counts = source if chunks else None
    if save_chunks:
        record.chunk_times_ms = [(c.time - t_send) * 1000 for c in chunks]
        record.chunk_tokens = tokens
    gaps = token_gaps(chunks, tokens)
    if gaps:
        count = sum(k for _, k in gaps)
        record.itl_mean_ms = sum(g * k for g, k in gaps) / count * 1000
        record.itl_max_ms = max(g for g, _ in gaps) * 1000
    return gaps


def _mismatch(chunks: Sequence[TokenMark], server_n: int) -> str | None:
    """The client-side checks a server count must pass. Content implies tokens. With per-chunk
    usage: the cumulative counts never fall and never pass the final count (they may end below
    it: a stop token or tool-call markers after the last chunk make no chunk). Without it: every
    generated chunk holds at least one token."""
    m = len(chunks)
    if server_n > 0 and m == 0:
        return f"server counted {server_n} tokens but sent no content"
    cums = [c.cum_tokens for c in chunks]
    if cums and all(c is not None for c in cums):
        prev = 0
        for c in cums:
            assert c is not None
            if c < prev:
                return f"per-chunk usage went down from {prev} to {c}"
            prev = c
        if prev > server_n:
            return f"per-chunk usage reaches {prev}, final usage says {server_n}"
        return None
    if server_n < m:
        return f"server counted {server_n} tokens in {m} content chunks"
    return None


# The SLOs `--goodput` takes, by SGLang's names: time to first token, time per output token after the
# first, end-to-end latency.
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def goodput(records: Sequence[RequestRecord], slos_ms: Mapping[str, float], duration: float) -> Goodput:
    """SLO goodput as SGLang's `calculate_goodput`: a request counts when it succeeded and met every
    SLO. A request of one token has no TPOT (counted 0, as there); one whose figure is missing (no
    generated output, so no TTFT) does not meet that SLO."""
    met = dict.fromkeys(slos_ms, 0)
    good = 0
    for r in records:
        if not r.ok:
            continue
        observed = {"ttft": r.ttft_ms, "tpot": _slo_tpot_ms(r), "e2el": r.e2e_ms}
        passed = [name for name, limit in slos_ms.items() if (v := observed[name]) is not None and v <= limit]
        for name in passed:
            met[name] += 1
        good += len(passed) == len(slos_ms)
    sent = len(records)
    return Goodput(
        goodput_slos_ms=dict(slos_ms),
        request_goodput=good / duration if duration > 0 else 0.0,
        slo_attainment=good / sent if sent else 0.0,
        slo_attainment_by_metric={name: n / sent if sent else 0.0 for name, n in met.items()},
    )


def _slo_tpot_ms(r: RequestRecord) -> float | None:
    """TPOT as `calculate_goodput` takes it: (E2E - TTFT) / (n - 1), 0 for a single token (and for a
    non-streamed answer, whose TTFT is its E2E)."""
    if r.output_tokens <= 1:
        return 0.0
    if r.ttft_ms is None or r.e2e_ms is None:
        return None
    return (r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1)


def summarize(
    records: Sequence[RequestRecord],
    gaps: Iterable[Gap],
    *,
    duration: float,
    max_concurrency: int | None,
    request_rate: float | None,
    mode: str,
    goodput_slos_ms: Mapping[str, float] | None = None,
) -> Level:
    """Aggregate one level; only successful requests enter latencies and throughputs. With
    `goodput_slos_ms` (wall-clock ms) the level carries its SLO goodput too."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    ttft = _ttfts(ok)
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    e2e = _e2es(ok)
    single = _single_throughputs(ok)
    decode = [r.decode_throughput for r in ok if r.decode_throughput is not None]
    gap_list = gaps if isinstance(gaps, list) else list(gaps)  # seconds; scaled to ms below
    itl_n = sum(k for _, k in gap_list)
    spec = [r for r in ok if r.spec_verify_ct]
    verify = sum(r.spec_verify_ct or 0 for r in spec)
    chunks = sum(r.client_chunks for r in ok)
    answer = [r.ttft_answer_ms for r in ok if r.ttft_answer_ms is not None]
    cached = [r for r in ok if r.cached_tokens is not None and r.input_tokens]
    itl_sources = Counter(r.itl_token_counts for r in ok if r.itl_token_counts)
    classes = priority_levels(records)
    waits = [r.client_wait_ms for r in records if r.client_wait_ms is not None]
    late = lateness_ms(records)
    return Level(
        max_concurrency=max_concurrency,
        completed=len(ok),
        failed=len(records) - len(ok),
        duration=duration,
        total_output_tokens=out_tokens,
        output_throughput=out_tokens / duration if duration > 0 else 0.0,
        request_throughput=len(ok) / duration if duration > 0 else 0.0,
        mean_request_output_throughput=_mean(single),
        median_ttft_ms=percentile(ttft, 50),
        p99_ttft_ms=percentile(ttft, 99),
        mean_tpot_ms=_mean(tpot),
        median_itl_ms=_ms(weighted_percentile(gap_list, 50)),
        mean_e2e_latency_ms=_mean(e2e),
        accept_length=sum(r.output_tokens for r in spec) / verify if verify else None,
        backends=dict(Counter(r.backend for r in records if r.backend)),
        mode=mode,
        request_rate=request_rate,
        mean_client_wait_ms=_mean(waits),
        p99_client_wait_ms=percentile(waits, 99),
        total_input_tokens=sum(r.input_tokens or 0 for r in ok),
        median_request_output_throughput=percentile(single, 50),
        mean_decode_throughput=_mean(decode),
        mean_ttft_ms=_mean(ttft),
        p90_ttft_ms=percentile(ttft, 90),
        median_tpot_ms=percentile(tpot, 50),
        p90_tpot_ms=percentile(tpot, 90),
        p99_tpot_ms=percentile(tpot, 99),
        mean_itl_ms=sum(g * k for g, k in gap_list) / itl_n * 1000 if itl_n else None,
        p90_itl_ms=_ms(weighted_percentile(gap_list, 90)),
        p99_itl_ms=_ms(weighted_percentile(gap_list, 99)),
        median_e2e_latency_ms=percentile(e2e, 50),
        p90_e2e_latency_ms=percentile(e2e, 90),
        p99_e2e_latency_ms=percentile(e2e, 99),
        errors=_errors(records),
        token_count_mismatches=sum(1 for r in ok if r.token_mismatch),
        mean_tokens_per_chunk=out_tokens / chunks if chunks else None,
        domains=dict(Counter(r.domain for r in records)),
        accept_length_by_domain=_accept_by_domain(spec),
        median_ttft_answer_ms=percentile(answer, 50),
        p90_ttft_answer_ms=percentile(answer, 90),
        p99_ttft_answer_ms=percentile(answer, 99),
        mean_ttft_answer_ms=_mean(answer),
        median_ttft_reasoning_ms=percentile([r.ttft_reasoning_ms for r in ok if r.ttft_reasoning_ms is not None], 50),
        total_reasoning_tokens=sum(r.reasoning_tokens or 0 for r in ok),
        reasoning_requests=sum(1 for r in ok if r.reasoning_tokens),
        total_cached_tokens=sum(r.cached_tokens or 0 for r in cached) if cached else None,
        cache_hit_rate=_hit_rate(cached),
        itl_token_counts=_itl_source(itl_sources),
        itl_exact_requests=itl_sources["usage"],
        finish_reasons=dict(Counter(r.finish_reason for r in ok if r.finish_reason)),
        tool_call_requests=sum(1 for r in ok if r.tool_calls or r.finish_reason == "tool_calls"),
        thinking=dict(Counter(_thinking_label(r.thinking) for r in records)),
        temperatures=dict(Counter(f"{r.temperature:g}" for r in records if r.temperature is not None)),
        priorities={str(c.priority): c.completed + c.failed for c in classes},
        sessions=len({r.session for r in records}) if any(r.session is not None for r in records) else None,
        turns=turn_levels(records),
        by_priority=classes,
        goodput=goodput(records, goodput_slos_ms, duration) if goodput_slos_ms else None,
        trace_requests=len(late) if late else None,
        trace_lateness_p50_ms=percentile([x for x, _ in late], 50),
        trace_lateness_p99_ms=percentile([x for x, _ in late], 99),
        trace_lateness_max_ms=max((x for x, _ in late), default=None),
        trace_on_time=sum(1 for x, due in late if on_time(x, due)) / len(late) if late else None,
    )


def lateness_ms(records: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """(ms sent after its due time, due offset in ms) of each replayed trace request."""
    return [((r.start_s - r.scheduled_s) * 1000, r.scheduled_s * 1000) for r in records if r.scheduled_s is not None]


def on_time(late_ms: float, due_ms: float) -> bool:
    """Sent within ON_TIME_SHARE of its due offset, or within ON_TIME_FLOOR_MS of it."""
    return late_ms <= max(ON_TIME_SHARE * due_ms, ON_TIME_FLOOR_MS)


def _thinking_label(thinking: bool | None) -> str:
    return "default" if thinking is None else ("on" if thinking else "off")


def _hit_rate(cached: Sequence[RequestRecord]) -> float | None:
    """sum(cached) / sum(input) over requests that reported both."""
    prompt = sum(r.input_tokens or 0 for r in cached)
    return sum(r.cached_tokens or 0 for r in cached) / prompt if prompt else None


def _itl_source(sources: Counter[str]) -> str | None:
    if not sources:
        return None
    if len(sources) == 1:
        return next(iter(sources))
    return "mixed"


def turn_levels(records: Sequence[RequestRecord]) -> list[TurnLevel]:
    """Per-turn figures of session datasets: the requests of each turn index (empty otherwise)."""
    by_turn: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.turn is not None:
            by_turn.setdefault(r.turn, []).append(r)
    out = []
    for turn in sorted(by_turn):
        rs = by_turn[turn]
        ok = [r for r in rs if r.ok]
        cached = [r for r in ok if r.cached_tokens is not None and r.input_tokens]
        inputs = [float(r.input_tokens) for r in ok if r.input_tokens is not None]
        out.append(
            TurnLevel(
                turn=turn,
                completed=len(ok),
                failed=len(rs) - len(ok),
                median_ttft_ms=percentile([r.ttft_ms for r in ok if r.ttft_ms is not None], 50),
                median_ttft_answer_ms=percentile([r.ttft_answer_ms for r in ok if r.ttft_answer_ms is not None], 50),
                median_e2e_latency_ms=percentile([r.e2e_ms for r in ok if r.e2e_ms is not None], 50),
                mean_input_tokens=_mean(inputs),
                mean_cached_tokens=_mean([float(r.cached_tokens or 0) for r in cached]),
                cache_hit_rate=_hit_rate(cached),
            )
        )
    return out


def _by_priority(records: Sequence[RequestRecord]) -> dict[int, list[RequestRecord]]:
    """The records sent with a priority, by its value, ascending; those sent without are left out."""
    out: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.priority is not None:
            out.setdefault(r.priority, []).append(r)
    return dict(sorted(out.items()))


def priority_levels(records: Sequence[RequestRecord]) -> list[PriorityLevel]:
    """Per-priority figures: the level's own definitions over the requests of each priority
    value sent (empty when none was)."""
    out = []
    for priority, rs in _by_priority(records).items():
        ok = [r for r in rs if r.ok]
        ttft, e2e = _ttfts(ok), _e2es(ok)
        out.append(
            PriorityLevel(
                priority=priority,
                completed=len(ok),
                failed=len(rs) - len(ok),
                errors=_errors(rs),
                median_ttft_ms=percentile(ttft, 50),
                p99_ttft_ms=percentile(ttft, 99),
                median_e2e_latency_ms=percentile(e2e, 50),
                p99_e2e_latency_ms=percentile(e2e, 99),
                mean_request_output_throughput=_mean(_single_throughputs(ok)),
            )
        )
    return out


def _accept_by_domain(spec: Sequence[RequestRecord]) -> dict[str, float]:
    """sum(n) / sum(verify) per prompt domain, over requests that reported speculation."""
    tokens: Counter[str] = Counter()
    verify: Counter[str] = Counter()
    for r in spec:
        tokens[r.domain] += r.output_tokens
        verify[r.domain] += r.spec_verify_ct or 0
    return {d: tokens[d] / verify[d] for d in sorted(verify) if verify[d]}
