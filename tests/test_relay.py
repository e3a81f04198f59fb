"""The SSE relay on crafted upstream streams: order kept, telemetry read, unrequested chunks removed."""

import itertools

import msgspec

from gateway.relay import SseRelay


def _ev(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _chunk(content=None, finish=None, role=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {"id": "abc", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                         "matched_stop": None}], "usage": None}


SGLEXT = {"id": "abc", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
          "sglext": {"spec_tokens_details": {"spec_verify_ct": 4, "spec_accept_length": 2.5}}}
USAGE = {"id": "abc", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17}}

STREAM = [_ev(_chunk(content="", role="assistant")), _ev(_chunk(content=" a b c")), _ev(_chunk(content=" d")),
          _ev(_chunk(content=" e f g h i j", finish=None)), _ev(_chunk(content="", finish="length")),
          _ev(SGLEXT), _ev(USAGE), b"data: [DONE]\n\n"]


def _run(relay: SseRelay, parts: list[bytes]) -> bytes:
    return b"".join(relay.feed(p) for p in parts)


def _ticking_clock():
    counter = itertools.count()
    return lambda: float(next(counter))


def test_client_that_asked_for_everything_gets_the_stream_unchanged():
    relay = SseRelay(keep_usage=True, keep_spec=True, clock=_ticking_clock())
    assert _run(relay, STREAM) == b"".join(STREAM)
    relay.finish_spec()
    t = relay.telemetry
    assert t.done and t.finish_reason == "length" and t.error is None
    assert t.usage.completion_tokens == 10 and t.usage.prompt_tokens == 7
    assert t.spec.verify_ct == 4 and t.spec.accept_length == 2.5
    # first and last *non-empty* content: the role chunk and the empty finish chunk do not count
    assert (t.t_first, t.t_last) == (0.0, 2.0)


def test_unrequested_telemetry_chunks_are_removed_and_order_kept():
    relay = SseRelay(keep_usage=False, keep_spec=False)
    out = _run(relay, STREAM)
    assert out == b"".join(STREAM[:5]) + b"data: [DONE]\n\n"
    relay.finish_spec()
    assert relay.telemetry.spec.accept_length == 2.5  # still read for the gateway itself


def test_usage_kept_spec_removed():
    relay = SseRelay(keep_usage=True, keep_spec=False)
    out = _run(relay, STREAM)
    assert out == b"".join(STREAM[:5]) + _ev(USAGE) + b"data: [DONE]\n\n"


def test_events_split_across_network_reads_byte_by_byte():
    whole = b"".join(STREAM)
    relay = SseRelay(keep_usage=True, keep_spec=True)
    assert _run(relay, [whole[i:i + 1] for i in range(len(whole))]) == whole
    assert relay.telemetry.done and relay.leftover() == b""


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
    assert relay.telemetry.error == "boom"


def test_completions_stream_text_chunks_count_as_content():
    chunk = {"id": "x", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": " hello", "logprobs": None, "finish_reason": None}]}
    relay = SseRelay(keep_usage=False, keep_spec=False, clock=_ticking_clock())
    assert relay.feed(_ev(chunk)) == _ev(chunk)
    assert relay.telemetry.t_first == 0.0


def test_spaced_json_falls_back_to_decoding_and_still_reads_telemetry():
    spaced = b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}\n\n'
    relay = SseRelay(keep_usage=False, keep_spec=False)
    assert relay.feed(spaced) == b""
    assert relay.telemetry.usage.completion_tokens == 3
