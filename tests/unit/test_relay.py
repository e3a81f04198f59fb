"""The SSE relay on crafted upstream streams: order kept, telemetry read, unrequested chunks removed;
and on SGLang 0.5.23-shaped byte fixtures, the same clock as `common.stream_clock`'s definition."""

import itertools

import msgspec
import pytest

from common.stream_clock import StreamClock
from gateway.relay import SseRelay
from tests.fixtures.streams.replay import NAMES, data_payloads, load


def _ev(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _chunk(content=None, finish=None, role=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {
        "id": "abc",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
        "usage": None,
    }


SGLEXT = {
    "id": "abc",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [],
    "sglext": {"spec_tokens_details": {"spec_verify_ct": 4, "spec_accept_length": 2.5}},
}
USAGE = {
    "id": "abc",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17},
}

STREAM = [
    _ev(_chunk(content="", role="assistant")),
    _ev(_chunk(content=" a b c")),
    _ev(_chunk(content=" d")),
    _ev(_chunk(content=" e f g h i j", finish=None)),
    _ev(_chunk(content="", finish="length")),
    _ev(SGLEXT),
    _ev(USAGE),
    b"data: [DONE]\n\n",
]


def _run(relay: SseRelay, parts: list[bytes]) -> bytes:
    return b"".join(relay.feed(p) for p in parts)


def _ticking_clock():
    counter = itertools.count()
    return lambda: float(next(counter))


def test_client_that_asked_for_everything_gets_the_stream_unchanged():
    relay = SseRelay(keep_usage=True, keep_spec=True, clock=_ticking_clock())
    assert _run(relay, STREAM) == b"".join(STREAM)
    relay.result.read_spec(True)
    t = relay.result
    assert t.done and t.finish_reason == "length" and t.error is None
    assert t.usage.completion_tokens == 10 and t.usage.prompt_tokens == 7
    assert t.spec.verify_ct == 4 and t.spec.accept_length == 2.5
    # first and last *non-empty* content: the role chunk and the empty finish chunk do not count
    assert (t.t_first, t.t_last) == (0.0, 2.0)


def test_unrequested_telemetry_chunks_are_removed_and_order_kept():
    relay = SseRelay(keep_usage=False, keep_spec=False)
    out = _run(relay, STREAM)
    assert out == b"".join(STREAM[:5]) + b"data: [DONE]\n\n"
    relay.result.read_spec(True)
    assert relay.result.spec.accept_length == 2.5  # still read for the gateway itself


def test_usage_kept_spec_removed():
    relay = SseRelay(keep_usage=True, keep_spec=False)
    out = _run(relay, STREAM)
    assert out == b"".join(STREAM[:5]) + _ev(USAGE) + b"data: [DONE]\n\n"


def test_events_split_across_network_reads_byte_by_byte():
    whole = b"".join(STREAM)
    relay = SseRelay(keep_usage=True, keep_spec=True)
    assert _run(relay, [whole[i : i + 1] for i in range(len(whole))]) == whole
    assert relay.result.done and relay.leftover() == b""


def test_spec_details_and_usage_in_one_chunk_keep_only_what_was_asked():
    both = {**USAGE, "sglext": SGLEXT["sglext"]}
    relay = SseRelay(keep_usage=True, keep_spec=False)
    out = relay.feed(_ev(both))
    assert msgspec.json.decode(out[6:]) == USAGE


def test_midstream_error_is_forwarded_and_recorded():
    err = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
    relay = SseRelay(keep_usage=False, keep_spec=False)
    out = _run(relay, [STREAM[0], STREAM[1], _ev(err), b"data: [DONE]\n\n"])
    assert out.endswith(_ev(err) + b"data: [DONE]\n\n")
    assert relay.result.error == "boom"


def test_completions_stream_text_chunks_count_as_content():
    chunk = {
        "id": "x",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": " hello", "logprobs": None, "finish_reason": None}],
    }
    relay = SseRelay(keep_usage=False, keep_spec=False, clock=_ticking_clock())
    assert relay.feed(_ev(chunk)) == _ev(chunk)
    assert relay.result.t_first == 0.0


def test_spaced_json_falls_back_to_decoding_and_still_reads_telemetry():
    spaced = b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}\n\n'
    relay = SseRelay(keep_usage=False, keep_spec=False)
    assert relay.feed(spaced) == b""
    assert relay.result.usage.completion_tokens == 3


def _delta_chunk(delta: dict, finish=None) -> dict:
    return {
        "id": "abc",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
    }


def test_reasoning_starts_the_clock_and_the_answer_is_timed_apart():
    relay = SseRelay(keep_usage=False, keep_spec=False, clock=_ticking_clock())
    # the clock ticks once per reading, and the relay reads it only for chunks with generated output
    parts = [
        _ev(_delta_chunk({"reasoning_content": None, "role": "assistant", "content": ""})),  # no output
        _ev(_delta_chunk({"reasoning_content": "Let me think"})),  # t=0
        _ev(_delta_chunk({"reasoning_content": ""})),  # empty: none
        _ev(_delta_chunk({"reasoning_content": None, "content": "42"})),  # t=1
        _ev(_delta_chunk({"reasoning_content": None}, finish="stop")),
    ]  # finish: none
    assert _run(relay, parts) == b"".join(parts)
    r = relay.result
    assert (r.t_first, r.t_first_answer, r.t_last, r.finish_reason) == (0.0, 1.0, 1.0, "stop")


def test_a_tool_call_delta_is_generated_output():
    call = {
        "role": None,
        "content": None,
        "reasoning_content": None,
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "index": 0,
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ],
    }
    relay = SseRelay(keep_usage=False, keep_spec=False, clock=_ticking_clock())
    relay.feed(_ev(_delta_chunk({"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None})))
    relay.feed(_ev(_delta_chunk(call)))
    assert (relay.result.t_first, relay.result.t_first_answer) == (0.0, 0.0)


def test_a_queue_full_error_event_is_read_with_its_code():
    relay = SseRelay(keep_usage=False, keep_spec=False)
    relay.feed(load("queue_full").data)
    r = relay.result
    assert r.error == "The request queue is full." and r.error_code == 503 and r.done and r.t_first is None


def _clock_of(fixture) -> StreamClock:
    """The shared definition, fed the same payloads at the same arrival times."""
    clock = StreamClock(t_start=0.0)
    for t, data in fixture.writes:
        for payload in data_payloads(data):
            if payload != b"[DONE]":
                clock.observe_payload(payload, t)
    return clock


def _relay_of(fixture, split: bool, keep: bool) -> tuple[SseRelay, bytes]:
    now = [0.0]
    relay = SseRelay(keep_usage=keep, keep_spec=keep, clock=lambda: now[0])
    out = []
    for t, data in fixture.writes:
        now[0] = t
        for part in [data[i : i + 7] for i in range(0, len(data), 7)] if split else [data]:
            out.append(relay.feed(part))
    relay.result.read_spec(True)
    return relay, b"".join(out)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", [False, True], ids=["as_written", "7_byte_reads"])
def test_the_relay_clock_is_the_shared_definition(name, split):
    """TTFT, first answer, decode span and speed, token counts, finish and error: the relay's byte
    searches and `common.stream_clock` agree on every SGLang-shaped fixture, however it is read."""
    fixture = load(name)
    expected = _clock_of(fixture)
    f = expected.figures()
    relay, out = _relay_of(fixture, split, keep=True)
    r = relay.result
    assert out == fixture.data  # a client that asked for everything gets the bytes unchanged
    assert r.t_first == expected.t_first and r.t_last == expected.t_last
    assert r.t_first_answer == expected.t_first_answer
    n = r.usage.completion_tokens if r.usage else None
    assert n == f.completion_tokens
    if r.t_first is not None:
        span = r.t_last - r.t_first
        assert span == f.decode_span
        assert ((n - 1) / span if n and n > 1 and span > 0 else None) == f.decode_tok_s
    assert (r.usage.reasoning_tokens if r.usage else None) == f.reasoning_tokens
    assert (r.usage.cached_tokens if r.usage else None) == f.cached_tokens
    assert r.finish_reason == expected.finish_reason
    assert r.error_code == (expected.error.code if expected.error else None)
    assert fixture.truth["first_token_ms"] is None or r.t_first == fixture.truth["first_token_ms"] / 1000


@pytest.mark.parametrize("name", NAMES)
def test_stripping_the_gateways_telemetry_keeps_the_clock(name):
    fixture = load(name)
    kept, _ = _relay_of(fixture, split=False, keep=True)
    stripped, out = _relay_of(fixture, split=False, keep=False)
    assert b'"sglext"' not in out
    assert (stripped.result.t_first, stripped.result.t_last, stripped.result.usage) == (
        kept.result.t_first,
        kept.result.t_last,
        kept.result.usage,
    )
