"""`loadgen --endpoint responses` (OpenAI's Responses API, `POST /v1/responses`): the body it sends,
the event parser on hand-made SGLang-shaped bytes split at arbitrary points, and levels, sessions,
thinking and errors against real twin processes (which serve SGLang 0.5.23's `/v1/responses`)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from loadgen.client import RequestOptions, Target, build_body, endpoint_url, settings
from loadgen.datasets import Message, Prompt, load_dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.metrics import measure
from loadgen.responses import ResponsesStreamParser, input_items, parse_full
from loadgen.summary import RequestRecord
from loadgen.targets import resolve
from tests.support import loadgen

RESPONSES = RequestOptions(endpoint="responses", max_tokens=24)

# ------------------------------------------------------------------------------ the body

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


# ---------------------------------------------------------------------- the event parser

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


# ------------------------------------------------------------------------- against twins


def _level(url: str, dataset: str, spec: LevelSpec, opts: RequestOptions, model: str | None = None) -> LevelResult:
    async def main() -> LevelResult:
        async with aiohttp.ClientSession() as http:
            target = await resolve(http, url, gateway_url=url, model=None, api_key=None)
            if model is not None:
                target = msgspec.structs.replace(target, model=model)
            return await run_level(http, target, load_dataset(dataset), spec, opts)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def plain(twin_factory: Any) -> str:
    url: str = twin_factory("k26-ar")
    return url


@pytest.mark.parametrize("stream", [True, False])
def test_a_level_against_the_twin(plain: str, stream: bool) -> None:
    opts = msgspec.structs.replace(RESPONSES, stream=stream)
    result = _level(plain, "mixed", LevelSpec(concurrency=2, num_prompts=4), opts)
    lv = result.level
    assert (lv.completed, lv.failed) == (4, 0) and lv.total_output_tokens == 4 * 24
    assert lv.accept_length is None  # no sglext on /v1/responses
    for r in result.records:
        assert r.ok and r.status == 200 and r.error is None
        assert r.output_tokens == 24 and r.output_tokens_source == "usage" and r.token_mismatch is None
        assert r.finish_reason == "length"  # the twin runs to its budget: response.incomplete
        assert r.ttft_ms is not None and r.e2e_ms is not None and r.ttft_ms <= r.e2e_ms
        assert r.input_tokens and r.cached_tokens is not None  # the Responses usage always has cached_tokens
        assert r.spec_verify_ct is None
    if stream:
        assert lv.itl_token_counts == "text_length" and lv.median_itl_ms is not None
        assert all(r.client_chunks > 1 and r.decode_throughput for r in result.records)
    else:
        assert all(r.client_chunks == 1 and r.ttft_ms == r.e2e_ms for r in result.records)


def test_sessions_replay_the_answers(plain: str) -> None:
    opts = msgspec.structs.replace(RESPONSES, thinking="off")
    result = _level(plain, "sessions", LevelSpec(concurrency=2, num_prompts=3), opts)
    ds = load_dataset("sessions")
    assert result.level.completed == sum(len(s.turns) for s in ds.take_sessions(3)) and result.level.failed == 0
    turns: dict[int | None, list[int | None]] = {}
    for r in sorted(result.records, key=lambda r: r.start_s):
        turns.setdefault(r.session, []).append(r.turn)
    assert all(ts == list(range(len(ts))) for ts in turns.values()) and len(turns) == 3
    inputs = [t.mean_input_tokens or 0 for t in result.level.turns]
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0]  # each turn sends the history so far
    # the history is the twin's own answers, so the next turn finds them in its prefix cache
    assert (result.level.turns[1].cache_hit_rate or 0) > (result.level.turns[0].cache_hit_rate or 0)


def test_thinking_splits_reasoning_from_the_answer_like_chat(twin_factory: Any) -> None:
    url = twin_factory("k26-dflash", "--reasoning-parser", "kimi_k2")
    spec = LevelSpec(concurrency=2, num_prompts=4)
    opts = RequestOptions(endpoint="responses", max_tokens=1200, thinking="on")
    result = _level(url, "chat", spec, opts)
    lv = result.level
    assert lv.completed == 4 and lv.reasoning_requests == 4 and lv.token_count_mismatches == 0
    assert lv.median_ttft_reasoning_ms == lv.median_ttft_ms
    assert lv.median_ttft_ms is not None and lv.median_ttft_answer_ms is not None
    assert lv.median_ttft_ms < lv.median_ttft_answer_ms
    answered = 0
    for r in result.records:
        # no ignore_eos on /v1/responses: an answer ends at its EOS, or at the budget
        assert r.reasoning_tokens and 0 < r.reasoning_tokens <= r.output_tokens <= 1200
        assert r.thinking is True and r.ttft_ms == r.ttft_reasoning_ms
        if r.ttft_answer_ms is not None:
            answered += 1
            assert r.ttft_ms is not None and r.ttft_answer_ms > r.ttft_ms
    assert answered >= 1
    # the input items render as the chat messages do: same prompt, so the same reasoning length
    chat = _level(url, "chat", spec, msgspec.structs.replace(opts, endpoint="chat"))
    for a, b in zip(result.records, chat.records, strict=True):
        assert (a.input_tokens, a.reasoning_tokens) == (b.input_tokens, b.reasoning_tokens)


def test_errors_are_failed_records_with_the_servers_message(twin_factory: Any, plain: str) -> None:
    url = twin_factory("k26-ar", "--context-length", "40")
    spec = LevelSpec(concurrency=1, num_prompts=2)
    streamed = _level(url, "math", spec, RESPONSES)  # streamed: 200, then response.failed
    for r in streamed.records:
        assert not r.ok and r.status == 200 and r.error == "stream_error"
        assert r.error_detail and "maximum context length of 40 tokens" in r.error_detail
    whole = _level(url, "math", spec, msgspec.structs.replace(RESPONSES, stream=False))  # not streamed: a 400
    for r in whole.records:
        assert not r.ok and r.error == "http_400" and "maximum context length" in (r.error_detail or "")
    unknown = _level(plain, "math", LevelSpec(concurrency=1, num_prompts=1), RESPONSES, model="nope")
    r = unknown.records[0]
    assert (r.ok, r.error, r.error_detail) == (False, "http_404", "The model 'nope' does not exist")
    assert unknown.level.failed == 1 and unknown.level.completed == 0


def test_cli_endpoint_responses(plain: str, tmp_path: Path) -> None:
    args = ("--target", plain, "--endpoint", "responses", "--concurrency", "2", "--num-prompts", "4")
    p = subprocess.run(
        loadgen(*args, "--max-tokens", "16", "--output", str(tmp_path), "--no-plots", "--no-progress"),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert p.returncode == 0, p.stderr
    assert "--endpoint responses: max_output_tokens = --max-tokens + 2" in " ".join(p.stdout.split())
    lv = json.loads((tmp_path / "summary.json").read_text())["runs"][0]["levels"][0]
    assert (lv["completed"], lv["total_output_tokens"], lv["accept_length"]) == (4, 64, None)
    p = subprocess.run(loadgen(*args, "--ignore-eos"), capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "no ignore_eos" in p.stderr and "Traceback" not in p.stderr
