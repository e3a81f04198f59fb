"""The Responses API's SSE relay: events pass through byte for byte, and the stream clock, usage,
id, finish and errors are read as SGLang 0.5.23 sends them (`event: <type>` then `data: <json>`)."""

from __future__ import annotations

import json

import pytest

from gateway.errors import ApiError
from gateway.openai_request import parse
from gateway.responses_relay import ResponsesRelay


def _event(kind: str, **fields) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n".encode()


def _response(status: str, usage: dict | None = None, **extra) -> dict:
    return {"id": "resp_1", "object": "response", "model": "kimi-k2.6", "status": status, "usage": usage, **extra}


USAGE = {
    "input_tokens": 40,
    "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 47,
}


def _stream(final: str = "response.completed", status: str = "completed", **final_extra) -> list[bytes]:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    return [
        _event("response.created", response=_response("in_progress"), sequence_number=0),
        _event("response.in_progress", response=_response("in_progress"), sequence_number=1),
        _event("response.reasoning_text.delta", item_id="rs_1", delta="thinking", sequence_number=2),
        _event("response.output_item.added", item=item, output_index=1, sequence_number=3),
        _event("response.output_text.delta", item_id="msg_1", delta="Hel", sequence_number=4),
        _event("response.output_text.delta", item_id="msg_1", delta="lo", sequence_number=5),
        _event("response.output_text.done", item_id="msg_1", text="Hello", sequence_number=6),
        _event(final, response=_response(status, USAGE, **final_extra), sequence_number=7),
    ]


def test_events_pass_through_untouched_and_telemetry_is_read():
    ticks = iter(range(100))
    relay = ResponsesRelay(clock=lambda: float(next(ticks)))
    events = _stream()
    sent = b"".join(relay.feed(e) for e in events)
    assert sent == b"".join(events)
    r = relay.result
    assert r.done and r.error is None and r.finish_reason == "stop" and r.response_id == "resp_1"
    assert r.t_first == 0.0 and r.t_first_answer == 1.0 and r.t_last == 2.0  # reasoning, then two answer deltas
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (40, 7)
    assert (r.usage.reasoning_tokens, r.usage.cached_tokens) == (3, 32)


def test_events_split_anywhere_give_the_same_bytes_and_result():
    whole = b"".join(_stream())
    relay = ResponsesRelay()
    sent = b"".join(relay.feed(whole[i : i + 7]) for i in range(0, len(whole), 7))
    assert sent == whole and relay.leftover() == b"" and relay.result.done


def test_an_incomplete_answer_finishes_by_length_and_a_failed_one_carries_its_error():
    relay = ResponsesRelay()
    for e in _stream("response.incomplete", "incomplete", incomplete_details={"reason": "max_output_tokens"}):
        relay.feed(e)
    assert relay.result.done and relay.result.finish_reason == "length"
    failed = ResponsesRelay()
    failed.feed(_event("response.created", response=_response("in_progress")))
    failed.feed(
        _event("response.failed", response=_response("failed", error={"code": "server_error", "message": "boom"}))
    )
    assert failed.result.done and failed.result.error == "boom" and failed.result.error_code == "server_error"
    assert failed.result.t_first is None  # no token: the proxy can still retry it elsewhere


def test_an_error_event_before_any_token_is_read():
    relay = ResponsesRelay()
    relay.feed(b'data: {"error":{"message":"The server is busy","code":503}}\n\n')
    assert relay.result.error == "The server is busy" and relay.result.error_code == 503


def _responses(**fields) -> bytes:
    return json.dumps({"model": "kimi-k2.6", **fields}).encode()


def test_a_responses_request_is_read_for_routing():
    parsed = parse(
        _responses(
            instructions="Be brief.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi there"}]}],
            max_output_tokens=64,
            stream=True,
            temperature=0.3,
        ),
        "responses",
    )
    assert parsed.prompt_text == "Be brief.\nHi there" and parsed.max_tokens == 62 and parsed.stream  # SGLang's -2
    assert parsed.temperature == 0.3 and parsed.client_wants_usage  # a Responses stream's usage is the client's
    plain = parse(_responses(input="plain"), "responses")
    assert plain.prompt_text == "plain" and plain.temperature is None  # the server's default, as for chat


@pytest.mark.parametrize(
    "fields,param",
    [({}, "input"), ({"input": []}, "input"), ({"input": 3}, "input"), ({"input": ["x"]}, "input[0]")],
)
def test_a_bad_input_is_a_400_naming_it(fields, param):
    with pytest.raises(ApiError) as e:
        parse(_responses(**fields), "responses")
    assert e.value.status == 400 and e.value.param == param


def test_response_owners_stay_bounded_and_keep_the_recently_used():
    from gateway.response_owners import ResponseOwners

    owners = ResponseOwners(capacity=1000)
    for i in range(1000):
        owners.record(f"resp_{i}", f"b{i % 4}")
    assert owners.owner("resp_0") == "b0"  # used: now the most recent
    for i in range(1000, 1500):
        owners.record(f"resp_{i}", "b9")
    assert len(owners) == 1000
    assert owners.owner("resp_0") == "b0" and owners.owner("resp_1") is None and owners.owner("resp_1499") == "b9"


def test_a_status_that_is_no_ending_gives_no_finish_reason():
    from gateway.records import Result
    from gateway.responses_relay import read_response

    cut = ResponsesRelay()  # a stream cut after its first events: it never finished
    cut.feed(_event("response.created", response=_response("in_progress")))
    assert cut.result.response_id == "resp_1" and cut.result.finish_reason is None
    queued = Result()  # a background request's immediate answer
    read_response(queued, _response("queued"))
    assert queued.finish_reason is None
    cancelled = Result()
    read_response(cancelled, _response("cancelled"))
    assert cancelled.finish_reason == "abort"
