"""Metric definitions on crafted streams: bytes with arrival times fed to the pure parser."""

from __future__ import annotations

import random

import msgspec
import pytest

from loadgen.metrics import apportion, measure, percentile, summarize, weighted_percentile
from loadgen.stream import StreamParser
from loadgen.summary import RequestRecord

_enc = msgspec.json.Encoder()


def role() -> bytes:
    return _frame([{"index": 0, "delta": {"role": "assistant", "content": ""}}])


def content(text: str, **extra) -> bytes:
    return _frame([{"index": 0, "delta": {"content": text}, "finish_reason": None}], **extra)


def finish() -> bytes:
    return _frame([{"index": 0, "delta": {}, "finish_reason": "length"}])


def usage(n: int, prompt: int = 7) -> bytes:
    return _frame([], usage={"prompt_tokens": prompt, "completion_tokens": n})


def sglext(verify: int) -> bytes:
    return _frame([], sglext={"spec_tokens_details": {"spec_verify_ct": verify}})


DONE = b"data: [DONE]\n\n"


def _frame(choices: list, **extra) -> bytes:
    return b"data: " + _enc.encode({"object": "chat.completion.chunk", "choices": choices, **extra}) + b"\n\n"


def run(
    reads: list[tuple[float, bytes]], *, t_send: float = 0.0, t_end: float | None = None, streamed: bool = True
) -> tuple[RequestRecord, list]:
    """Feed timed reads, classify like the client does, and measure."""
    p = StreamParser()
    for t, data in reads:
        p.feed(data, t)
    end = reads[-1][0] if t_end is None else t_end
    p.close(end)
    kind, detail = p.outcome()
    rec = RequestRecord(
        index=0,
        target="t",
        max_concurrency=1,
        request_rate=None,
        domain="math",
        start_s=0.0,
        ok=kind is None,
        error=kind,
        error_detail=detail,
    )
    gaps = measure(p, t_send=t_send, t_end=end, streamed=streamed, record=rec)
    return rec, gaps


def test_one_token_per_chunk_ttft_tpot_itl() -> None:
    rec, gaps = run(
        [
            (0.2, role()),
            (0.5, content(" a")),
            (0.6, content(" b")),
            (0.7, content(" c")),
            (0.8, content(" d")),
            (0.9, finish() + usage(4) + DONE),
        ]
    )
    assert rec.ok and rec.error is None
    assert rec.ttft_ms == pytest.approx(500)  # the empty role chunk at 0.2 is not the first token
    assert rec.e2e_ms == pytest.approx(900)
    assert rec.tpot_ms == pytest.approx((900 - 500) / 3)
    assert [(round(g, 6), k) for g, k in gaps] == [(0.1, 1)] * 3
    assert rec.output_tokens == 4 and rec.output_tokens_source == "usage"
    assert rec.input_tokens == 7 and rec.client_chunks == 4 and rec.token_mismatch is None
    assert rec.output_throughput == pytest.approx(4 / 0.9)
    assert rec.decode_throughput == pytest.approx(3 / 0.3)
    assert rec.accept_length is None and rec.finish_reason == "length"


def test_multi_token_chunks_split_gaps_per_token() -> None:
    # speculation: 1 token, then a verify step of 3 tokens, then one of 2 (text length tells)
    rec, gaps = run(
        [
            (0.0, role()),
            (1.0, content(" a")),
            (1.3, content(" b c d")),
            (1.5, content(" e f")),
            (1.6, finish() + sglext(3) + usage(6) + DONE),
        ],
        t_send=0.5,
    )
    assert rec.ok
    assert rec.ttft_ms == pytest.approx(500)
    assert rec.tpot_ms == pytest.approx((1100 - 500) / 5)
    assert [(round(g, 6), k) for g, k in gaps] == [(0.1, 3), (0.1, 2)]  # not raw gaps 0.3, 0.2
    assert rec.itl_mean_ms == pytest.approx(100)
    assert rec.accept_length == pytest.approx(2.0) and rec.spec_verify_ct == 3
    assert rec.token_mismatch is None  # fewer chunks than tokens is fine under speculation


def test_continuous_usage_gives_exact_tokens_per_chunk() -> None:
    # per-chunk cumulative usage overrides the text-length split (here text lengths mislead)
    reads = [
        (1.0, content(" abcdefgh", usage={"completion_tokens": 1})),
        (1.4, content(" x", usage={"completion_tokens": 5})),
        (1.5, finish() + usage(5) + DONE),
    ]
    rec, gaps = run(reads)
    assert [(round(g, 6), k) for g, k in gaps] == [(0.1, 4)]
    assert rec.token_mismatch is None


def test_error_mid_stream_is_counted_by_kind() -> None:
    err = b'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
    rec, gaps = run([(0.1, role() + content(" a")), (0.2, content(" b")), (0.3, err + DONE)])
    assert not rec.ok and rec.error == "stream_error" and rec.error_detail == "boom"
    assert rec.client_chunks == 2  # partial figures kept for debugging
    level = summarize([rec], gaps, duration=1.0, max_concurrency=1, request_rate=None, mode="closed")
    assert level.completed == 0 and level.failed == 1 and level.errors == {"stream_error": 1}
    assert level.total_output_tokens == 0 and level.median_ttft_ms is None


def test_stream_without_done_is_broken() -> None:
    rec, _ = run([(0.1, role() + content(" a")), (0.2, content(" b"))])
    assert not rec.ok and rec.error == "broken_stream"


def test_not_an_sse_stream_is_bad_response() -> None:
    rec, _ = run([(0.1, b"<html>hello</html>")])
    assert not rec.ok and rec.error == "bad_response" and "OpenAI-compatible" in rec.error_detail


def test_event_split_across_reads_counts_when_complete() -> None:
    frame = content(" hello")
    rec, _ = run([(0.1, role()), (0.2, frame[:10]), (0.35, frame[10:]), (0.4, finish() + usage(1) + DONE)])
    assert rec.ttft_ms == pytest.approx(350)


def test_missing_usage_falls_back_to_client_count_and_is_reported() -> None:
    rec, _ = run([(0.1, content(" a")), (0.2, content(" b")), (0.3, finish() + DONE)])
    assert rec.ok and rec.output_tokens == 2 and rec.output_tokens_source == "client"
    assert rec.token_mismatch == "server sent no usage"


def test_server_count_below_chunk_count_is_a_mismatch() -> None:
    rec, _ = run([(0.1, content(" a")), (0.2, content(" b")), (0.3, content(" c")), (0.4, usage(2) + DONE)])
    assert rec.ok and rec.output_tokens == 2
    assert rec.token_mismatch == "server counted 2 tokens in 3 content chunks"
    level = summarize([rec], [], duration=1.0, max_concurrency=1, request_rate=None, mode="closed")
    assert level.token_count_mismatches == 1


def test_reasoning_content_counts_as_first_token() -> None:
    think = _frame([{"index": 0, "delta": {"reasoning_content": "hmm"}}])
    rec, _ = run([(0.0, role()), (0.25, think), (0.5, content(" a")), (0.6, finish() + usage(2) + DONE)])
    assert rec.ttft_ms == pytest.approx(250)


def test_non_streamed_ttft_is_e2e_and_no_itl() -> None:
    p = StreamParser()
    from loadgen.stream import TokenMark, Usage

    p.chunks.append(TokenMark(2.0, 40, None))
    p.usage = Usage(prompt_tokens=3, completion_tokens=10)
    rec = RequestRecord(index=0, target="t", max_concurrency=1, request_rate=None, domain="chat", start_s=0.0, ok=True)
    gaps = measure(p, t_send=0.0, t_end=2.0, streamed=False, record=rec)
    assert gaps == [] and rec.ttft_ms == pytest.approx(2000) and rec.tpot_ms is None
    assert rec.output_throughput == pytest.approx(5.0)


def test_level_aggregates() -> None:
    a, ga = run(
        [(1.0, content(" a")), (1.2, content(" b c")), (1.3, finish() + sglext(2) + usage(3) + DONE)], t_send=0.0
    )
    b, gb = run(
        [
            (0.5, content(" a")),
            (0.6, content(" b")),
            (0.7, content(" c")),
            (0.8, content(" d")),
            (1.0, finish() + usage(4) + DONE),
        ],
        t_send=0.0,
    )
    level = summarize([a, b], ga + gb, duration=2.0, max_concurrency=2, request_rate=None, mode="closed")
    assert level.completed == 2 and level.total_output_tokens == 7
    assert level.output_throughput == pytest.approx(3.5)
    assert level.request_throughput == pytest.approx(1.0)
    assert level.mean_request_output_throughput == pytest.approx((3 / 1.3 + 4 / 1.0) / 2)
    assert level.median_ttft_ms == pytest.approx(750)
    assert level.mean_e2e_latency_ms == pytest.approx(1150)
    # pooled per-token ITL samples: a -> 0.1 x2; b -> 0.1 x3
    assert level.median_itl_ms == pytest.approx(100) and level.mean_itl_ms == pytest.approx(100)
    # accept length only from the request that reported it: 3 tokens / 2 verify steps
    assert level.accept_length == pytest.approx(1.5)
    assert level.mean_tokens_per_chunk == pytest.approx(7 / 6)


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_weighted_percentile_equals_expanded_sample(q: float) -> None:
    rng = random.Random(q)
    pairs = [(rng.random(), rng.randint(1, 5)) for _ in range(200)]
    expanded = [v for v, k in pairs for _ in range(k)]
    assert weighted_percentile(pairs, q) == pytest.approx(percentile(expanded, q))


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 20.0], 99) == pytest.approx(19.9)
    assert percentile([], 50) is None


@pytest.mark.parametrize(
    "total, weights, expect",
    [
        (6, [2, 6, 4], [1, 3, 2]),  # proportional to text length
        (10, [1, 1, 100], [1, 1, 8]),  # at least one token per chunk
        (3, [5, 5, 5], [1, 1, 1]),
        (2, [5, 5, 5], [1, 1, 1]),  # fewer tokens than chunks: one each (reported as mismatch)
        (5, [0, 0], [3, 2]),  # no text: even split, remainder to the earlier chunk
    ],
)
def test_apportion(total: int, weights: list[int], expect: list[int]) -> None:
    assert apportion(total, weights) == expect
