"""common/stream_clock.py on the SGLang-shaped byte fixtures (tests/fixtures/streams): every stream's
figures against the truth its scenario was built with."""

from __future__ import annotations

import msgspec
import pytest

from common.stream_clock import (
    ChatDelta,
    Choice,
    Chunk,
    Output,
    StreamClock,
    ToolCallDelta,
    chunk_output,
    chunk_token_counts,
    decode_chunk,
)
from tests.fixtures.streams.replay import NAMES, Fixture, data_payloads, load


def replay(fx: Fixture, *, keep_marks: bool = True) -> StreamClock:
    clock = StreamClock(t_start=0.0, keep_marks=keep_marks)
    for t, frames in fx.writes:
        for payload in data_payloads(frames):
            if payload != b"[DONE]":
                clock.observe_payload(payload, t)
    return clock


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 6)


def test_every_fixture_is_there() -> None:
    assert set(NAMES) >= {
        "thinking",
        "thinking_continuous_usage",
        "thinking_boundary_continuous_usage",
        "tool_call",
        "plain",
        "plain_continuous_usage",
        "completions",
        "completions_continuous_usage",
        "queue_full",
    }


@pytest.mark.parametrize("name", NAMES)
def test_clock_matches_the_scenario(name: str) -> None:
    fx = load(name)
    truth = fx.truth
    clock = replay(fx)
    f = clock.figures()
    assert ms(f.ttft) == truth["first_token_ms"]
    assert ms(f.ttft_reasoning) == truth["first_reasoning_ms"]
    assert ms(f.ttft_answer) == truth["first_answer_ms"]
    assert f.completion_tokens == truth["completion_tokens"]
    assert f.cached_tokens == truth["cached_tokens"]
    assert clock.finish_reason == truth["finish_reason"]
    if truth["error_code"] is not None:
        assert clock.error is not None and clock.error.code == truth["error_code"]
        assert f.ttft is None and f.decode_tok_s is None and clock.generated_chunks == 0
        return
    assert clock.error is None
    # SGLang reports reasoning_tokens = 0 on streams without a reasoning parser.
    assert (f.reasoning_tokens or 0) == truth["reasoning_tokens"]
    span = (truth["last_token_ms"] - truth["first_token_ms"]) / 1000
    assert f.decode_span == pytest.approx(span)
    assert f.decode_tok_s == pytest.approx((truth["completion_tokens"] - 1) / span)
    assert clock.generated_chunks == sum(s["generated_chunks"] for s in truth["steps"])


def expected_counts(truth: dict) -> list[int]:
    """Tokens per generated chunk by the definition, from the scenario's tokens per step: a step's
    tokens plus those of the chunk-less steps before it go to its first chunk, 0 to the others."""
    out, pending = [], 0
    for step in truth["steps"]:
        pending += step["tokens"]
        if step["generated_chunks"]:
            out += [pending] + [0] * (step["generated_chunks"] - 1)
            pending = 0
    return out


@pytest.mark.parametrize("name", [n for n in NAMES if n.endswith("continuous_usage") or n == "tool_call"])
def test_exact_tokens_per_chunk_from_continuous_usage(name: str) -> None:
    fx = load(name)
    assert fx.manifest["request"]["stream_options"]["continuous_usage_stats"]
    counts = chunk_token_counts(replay(fx).marks)
    assert counts == expected_counts(fx.truth)
    # Tokens after the last chunk (a stop token, tool-call end markers) are in no chunk.
    assert sum(counts) <= fx.truth["completion_tokens"]


@pytest.mark.parametrize("name", ["thinking", "plain", "completions"])
def test_no_exact_counts_without_continuous_usage(name: str) -> None:
    assert chunk_token_counts(replay(load(name)).marks) is None


def test_thinking_time_is_the_gap_between_first_reasoning_and_first_answer() -> None:
    f = replay(load("thinking")).figures()
    assert f.ttft == f.ttft_reasoning
    assert f.ttft_answer is not None and f.ttft is not None and f.ttft_answer > f.ttft
    assert f.reasoning_tokens == 14


def test_tool_call_chunks_are_answer_output() -> None:
    clock = replay(load("tool_call"))
    f = clock.figures()
    assert clock.finish_reason == "tool_calls"
    # The first answer is the tool call's name chunk (arguments ""), not a content chunk.
    assert ms(f.ttft_answer) == 398.5


def test_the_role_and_finish_chunks_carry_no_output() -> None:
    first = data_payloads(load("thinking").writes[0][1])[0]
    assert chunk_output(decode_chunk(first)) == (Output.NONE, 0)
    role_only = Chunk(choices=[Choice(delta=ChatDelta(role="assistant", content="", reasoning_content=""))])
    assert chunk_output(role_only)[0] == Output.NONE
    empty_calls = Chunk(choices=[Choice(delta=ChatDelta(tool_calls=[]))])
    assert chunk_output(empty_calls)[0] == Output.NONE
    call = Chunk(choices=[Choice(delta=ChatDelta(tool_calls=[ToolCallDelta(index=0)]))])
    assert chunk_output(call)[0] == Output.ANSWER


def test_usage_reads_openai_and_sglang_places() -> None:
    c = decode_chunk(
        b'{"choices":[],"usage":{"completion_tokens":9,'
        b'"completion_tokens_details":{"reasoning_tokens":4},"prompt_tokens_details":{"cached_tokens":3}}}'
    )
    assert c.usage is not None and c.usage.reasoning_tokens == 4 and c.usage.cached_tokens == 3
    c = decode_chunk(b'{"choices":[],"usage":{"completion_tokens":9,"reasoning_tokens":5}}')
    assert c.usage is not None and c.usage.reasoning_tokens == 5 and c.usage.cached_tokens is None


def test_a_proxy_clock_keeps_nothing_per_chunk() -> None:
    clock = replay(load("thinking_continuous_usage"), keep_marks=False)
    assert clock.marks == [] and clock.generated_chunks > 0
    assert clock.figures().ttft is not None


def test_completion_tokens_override_for_clients_without_usage() -> None:
    clock = StreamClock(t_start=0.0)
    for i, text in enumerate(["a", "b", "c"]):
        clock.observe(Chunk(choices=[Choice(text=text)]), 1.0 + i)
    f = clock.figures(completion_tokens=3)
    assert f.completion_tokens == 3 and f.decode_tok_s == pytest.approx(1.0)
    assert clock.figures().decode_tok_s is None  # no usage, no count: no rate


def test_undecodable_payload_raises() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_chunk(b"not json")
    with pytest.raises(msgspec.DecodeError):
        decode_chunk(b'{"choices": 3}')


def test_string_error_shape() -> None:
    clock = StreamClock(t_start=0.0)
    clock.observe(decode_chunk(b'{"error": "boom"}'), 0.1)
    assert clock.error is not None and clock.error.message == "boom"
