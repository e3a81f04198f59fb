"""`loadgen --endpoint responses` without a server: the body it sends, history as message and
function-call items, and the event parser on hand-made SGLang-shaped bytes split at arbitrary points
(against real twins: tests/integration/test_loadgen_responses.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec

from loadgen.client import RequestOptions, Target, build_body, endpoint_url, settings
from loadgen.datasets import Message, Prompt
from loadgen.metrics import measure
from loadgen.responses import ResponsesStreamParser, input_items, parse_full
from loadgen.summary import RequestRecord

RESPONSES = RequestOptions(endpoint="responses", max_tokens=24)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _decoded(prompt: Prompt, opts: RequestOptions) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(build_body(Target(label="t", url="http://h", model="m"), prompt, opts))
    return out


def test_body_is_a_responses_request_with_two_tokens_of_headroom() -> None:
    prompt = Prompt(
        messages=(Message("system", "be brief"), Message("user", "weather in Paris?")),
        domain="chat",
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    body = _decoded(prompt, msgspec.structs.replace(RESPONSES, thinking="on", top_p=0.9, ignore_eos=True))
    assert body == {
        "model": "m",
        "input": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"}],
        "max_output_tokens": 26,  # SGLang generates max_output_tokens - 2: the chat run's 24
        "temperature": 0.0,
        "stream": True,
        "store": False,
        "top_p": 0.9,
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "chat_template_kwargs": {"thinking": True},
    }  # no stream_options, return_spec_tokens_details or ignore_eos: SGLang's ResponsesRequest has none
    assert "stream_options" not in _decoded(prompt, msgspec.structs.replace(RESPONSES, stream=False))
    assert endpoint_url(Target(label="t", url="http://h/", model="m"), RESPONSES) == "http://h/v1/responses"
    assert settings(prompt, RESPONSES, 0).max_tokens == 24


def test_history_becomes_message_and_function_call_items() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = (
        Message("user", [{"type": "text", "text": "hi"}]),
        Message("assistant", "let me look", tool_calls=[call]),
        Message("tool", "sunny", tool_call_id="call_1"),
        Message("assistant", [{"type": "text", "text": "It is sunny."}]),
    )
    assert input_items(messages) == [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"role": "assistant", "content": "let me look"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
    ]
    # a call without text: no empty message item before it
    assert [i.get("type") for i in input_items((Message("assistant", None, tool_calls=[call]),))] == ["function_call"]


USAGE = {
    "input_tokens": 30,
    "input_tokens_details": {"cached_tokens": 16, "cache_write_tokens": 0},
    "output_tokens": 12,
    "output_tokens_details": {"reasoning_tokens": 4},
    "total_tokens": 42,
}


REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "Let me think."}],
}


MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "The answer is 4.", "annotations": []}],
}


CALL = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "status": "completed",
}


def _response(status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": output, "usage": None, **extra}


def _events(terminal: dict[str, Any]) -> list[dict[str, Any]]:
    """A thinking answer with a tool call as SGLang 0.5.23 streams it (the terminal event last)."""
    started = _response("in_progress", [])
    rs, msg, fc = {"item_id": "rs_1", "output_index": 0}, {"item_id": "msg_1", "output_index": 1}, {"item_id": "fc_1"}
    return [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.output_item.added", "output_index": 0, "item": {**REASONING, "content": []}},
        {
            "type": "response.content_part.added",
            **rs,
            "content_index": 0,
            "part": {"type": "reasoning_text", "text": ""},
        },
        {"type": "response.reasoning_text.delta", **rs, "content_index": 0, "delta": "Let me"},
        {"type": "response.reasoning_text.delta", **rs, "content_index": 0, "delta": " think."},
        {"type": "response.reasoning_text.done", **rs, "content_index": 0, "text": "Let me think."},
        {"type": "response.output_item.done", "output_index": 0, "item": REASONING},
        {"type": "response.output_item.added", "output_index": 1, "item": {**MESSAGE, "content": []}},
        {"type": "response.content_part.added", **msg, "content_index": 0, "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", **msg, "content_index": 0, "delta": "The answer"},
        {"type": "response.output_text.delta", **msg, "content_index": 0, "delta": " is 4."},
        {"type": "response.output_text.done", **msg, "content_index": 0, "text": "The answer is 4."},
        {"type": "response.output_item.done", "output_index": 1, "item": MESSAGE},
        {"type": "response.output_item.added", "output_index": 2, "item": {**CALL, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", **fc, "output_index": 2, "delta": '{"city":'},
        {"type": "response.function_call_arguments.delta", **fc, "output_index": 2, "delta": ' "Paris"}'},
        {"type": "response.output_item.done", "output_index": 2, "item": CALL},
        terminal,
    ]


COMPLETED = {
    "type": "response.completed",
    "response": {**_response("completed", [REASONING, MESSAGE, CALL]), "usage": USAGE},
}


def _frames(events: list[dict[str, Any]]) -> list[bytes]:
    """`event: <type>\\ndata: <json>\\n\\n` with the sequence numbers; no `data: [DONE]`."""
    out = []
    for seq, ev in enumerate(events):
        data = json.dumps({**ev, "sequence_number": seq}).encode()
        out.append(b"event: " + ev["type"].encode() + b"\ndata: " + data + b"\n\n")
    return out


def _cuts(data: bytes, rng: random.Random) -> list[bytes]:
    """`data` in pieces cut at 0-3 random points."""
    points = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 3))))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _parse(writes: list[tuple[float, bytes]]) -> ResponsesStreamParser:
    parser = ResponsesStreamParser(keep_answer=True)
    for t, data in writes:
        parser.feed(data, t)
    parser.close(writes[-1][0] if writes else 0.0)
    return parser


def _figures(p: ResponsesStreamParser) -> dict[str, Any]:
    f = p.clock.figures()
    return {
        "ttft": f.ttft,
        "reasoning": f.ttft_reasoning,
        "answer": f.ttft_answer,
        "span": f.decode_span,
        "marks": [(m.time, m.chars) for m in p.chunks],
        **_counts(p),
    }


def _counts(p: ResponsesStreamParser) -> dict[str, Any]:
    f = p.clock.figures()
    return {
        "tokens": (f.completion_tokens, f.prompt_tokens, f.cached_tokens, f.reasoning_tokens),
        "finish": p.finish_reason,
        "outcome": p.outcome(),
        "answer": msgspec.to_builtins(p.answer),
    }


def test_event_parser_times_every_kind_of_output() -> None:
    p = _parse([(float(i), f) for i, f in enumerate(_frames(_events(COMPLETED)))])
    f = p.clock.figures()
    assert (f.ttft, f.ttft_reasoning, f.ttft_answer, f.decode_span) == (4.0, 4.0, 10.0, 16.0 - 4.0)
    assert [m.time for m in p.chunks] == [4.0, 5.0, 10.0, 11.0, 14.0, 15.0, 16.0]  # the call's name counts
    assert all(m.cum_tokens is None for m in p.chunks)  # no per-event usage
    assert (f.completion_tokens, f.prompt_tokens, f.cached_tokens, f.reasoning_tokens) == (12, 30, 16, 4)
    assert p.finish_reason == "tool_calls" and p.outcome() == (None, None) and p.spec is None
    assert p.answer is not None
    assert (p.answer.reasoning, p.answer.content) == ("Let me think.", "The answer is 4.")
    assert p.answer.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    rec = RequestRecord(index=0, target="t", max_concurrency=1, request_rate=None, domain="d", start_s=0.0, ok=True)
    gaps = measure(p, t_send=0.0, t_end=20.0, streamed=True, record=rec)
    assert (rec.output_tokens, rec.input_tokens, rec.cached_tokens, rec.reasoning_tokens) == (12, 30, 16, 4)
    assert (rec.ttft_ms, rec.ttft_reasoning_ms, rec.ttft_answer_ms) == (4000.0, 4000.0, 10000.0)
    assert rec.tool_calls == 1 and rec.itl_token_counts == "text_length" and rec.token_mismatch is None
    assert len(gaps) == len(p.chunks) - 1  # ITL as chat records it: a sample per chunk after the first


def test_event_parser_is_indifferent_to_how_reads_split_the_bytes() -> None:
    frames = _frames(_events(COMPLETED))
    want = _figures(_parse([(float(i), f) for i, f in enumerate(frames)]))
    rng = random.Random(7)
    for _ in range(200):  # each frame in random pieces, every piece arriving at its frame's time
        writes = [(float(i), piece) for i, f in enumerate(frames) for piece in _cuts(f, rng)]
        assert _figures(_parse(writes)) == want
    blob = b"".join(frames)
    counts = _counts(_parse([(0.0, blob)]))
    for cut in range(1, len(blob)):  # the whole stream in two reads, cut anywhere
        assert _counts(_parse([(0.0, blob[:cut]), (1.0, blob[cut:])])) == counts


def test_event_parser_outcomes() -> None:
    failed = {
        "type": "response.failed",
        "response": {**_response("failed", []), "error": {"code": "server_error", "message": "context too long"}},
    }
    p = _parse([(0.0, b"".join(_frames([*_events(COMPLETED)[:2], failed])))])
    assert p.outcome() == ("stream_error", "context too long") and p.finish_reason == "error"
    incomplete = {
        "type": "response.incomplete",
        "response": {
            **_response("incomplete", [REASONING]),
            "usage": USAGE,
            "incomplete_details": {"reason": "max_output_tokens"},
        },
    }
    p = _parse([(0.0, b"".join(_frames([*_events(incomplete)[:8], incomplete])))])
    assert p.outcome() == (None, None) and p.finish_reason == "length" and p.clock.t_first_answer is None
    p = _parse([(0.0, b"".join(_frames(_events(COMPLETED)[:-1])))])  # cut before the terminal event
    assert p.outcome() == ("broken_stream", f"stream ended before {ResponsesStreamParser.END}")
    p = _parse([(0.0, b'data: {"error": {"message": "no backend left", "code": 503}}\n\n')])  # a gateway's
    assert p.outcome() == ("stream_error", "no backend left")
    p = _parse(
        [(0.0, b'event: error\ndata: {"type": "error", "code": "x", "message": "boom", "sequence_number": 3}\n\n')]
    )
    assert p.outcome() == ("stream_error", "boom")


def test_non_streamed_response_fills_the_same_fields() -> None:
    body = json.dumps({**_response("completed", [REASONING, MESSAGE]), "usage": USAGE}).encode()
    p = ResponsesStreamParser(keep_answer=True)
    assert parse_full(body, p, 3.0) is None
    assert p.finish_reason == "stop" and p.answer is not None and p.answer.content == "The answer is 4."
    assert p.answer.reasoning == "Let me think." and p.clock.t_first_reasoning == p.clock.t_first_answer == 3.0
    assert p.usage is not None and (p.usage.completion_tokens, p.usage.cached_tokens, p.usage.reasoning_tokens) == (
        12,
        16,
        4,
    )
    failed = {**_response("failed", []), "error": {"code": "server_error", "message": "engine died"}}
    assert parse_full(json.dumps(failed).encode(), ResponsesStreamParser(), 1.0) == ("stream_error", "engine died")
    assert parse_full(b"<html>", ResponsesStreamParser(), 1.0) is not None
