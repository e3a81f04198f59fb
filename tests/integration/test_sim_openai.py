"""The twin's K2.6 traffic features over real HTTP, with the real openai SDK where it applies:
thinking (kimi_k2 reasoning parser), tool calls, invalid tools, continuous usage, the prefix cache
across turns, and SGLang's stream semantics (queue-full event, headers after the first token)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import openai
import pytest

from tests.integration.test_sim_server import _start, get, post, sse, twin
from twin.chat_output import THINK_END
from twin.domain import classify, prompt_key
from twin.profile import load_profile
from twin.text import render_chat
from twin.thinking import reasoning_tokens

PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
LYON = "Tell me about the history of Lyon."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _start("k26-dflash", *PARSERS, "--enable-cache-report", "--enable-metrics")


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    yield from _start("k26-ar")  # no parsers: the model still thinks, inline in content


def _expected_reasoning(messages: list[tuple[str, str]]) -> int:
    text = render_chat(messages)
    return reasoning_tokens(load_profile("k26-dflash").reasoning, classify(text), prompt_key(text))


def _chat(content: str) -> dict:
    return {"model": "kimi-k2.6", "messages": [{"role": "user", "content": content}]}


# ------------------------------------------------------------------------------ thinking


def test_thinking_stream_reasoning_then_content_sdk(url):
    r = _expected_reasoning([("user", LYON)])
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    stream = client.chat.completions.create(
        model="kimi-k2.6",
        messages=[{"role": "user", "content": LYON}],
        max_tokens=r + 30,
        stream=True,
        stream_options={"include_usage": True},
    )
    phases, reasoning, content, usage, reasons = [], "", "", None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        rc = getattr(delta, "reasoning_content", None)
        if rc:
            reasoning += rc
            phases.append("r")
        if delta.content:
            content += delta.content
            phases.append("c")
        reasons.append(chunk.choices[0].finish_reason)
    assert phases[0] == "r" and phases[-1] == "c"
    assert "c" not in phases[: phases.index("c")] and "r" not in phases[phases.index("c") + 1 :]
    assert THINK_END not in reasoning + content
    assert len(reasoning.split()) == r - 1  # the </think> token is counted but not shown
    assert len(content.split()) == 30
    assert usage.completion_tokens == r + 30
    assert usage.model_extra["reasoning_tokens"] == r
    assert usage.completion_tokens_details.reasoning_tokens == r
    assert reasons[-1] == "length"


def test_thinking_finish_chunk_bytes(url):
    events = sse(f"{url}/v1/chat/completions", {**_chat(LYON), "max_tokens": 12})
    role, finish = events[0], events[-2]
    assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert "usage" not in finish  # msgspec omit_defaults drops a null usage
    body = [e["choices"][0]["delta"] for e in events[1:-2]]
    assert all(set(d) == {"reasoning_content"} for d in body)  # all 12 tokens are reasoning


def test_thinking_non_stream_message_and_usage(url):
    r = _expected_reasoning([("user", LYON)])
    status, body = post(f"{url}/v1/chat/completions", {**_chat(LYON), "max_tokens": r + 8})
    assert status == 200
    msg = body["choices"][0]["message"]
    assert len(msg["reasoning_content"].split()) == r - 1
    assert len(msg["content"].split()) == 8
    assert body["usage"]["reasoning_tokens"] == r
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": r}
    assert body["metadata"] == {"weight_version": "default"}


@pytest.mark.parametrize(
    "extra",
    [
        {"chat_template_kwargs": {"thinking": False}},
        {"chat_template_kwargs": {"thinking": False, "bogus": [1], "enable_thinking": "yes"}},
        {"reasoning_effort": "none"},
    ],
)
def test_thinking_off(url, extra):
    status, body = post(f"{url}/v1/chat/completions", {**_chat(LYON), "max_tokens": 10, **extra})
    assert status == 200
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] is None and len(msg["content"].split()) == 10
    assert body["usage"]["reasoning_tokens"] == 0


@pytest.mark.parametrize("kwargs", [{"bogus": 1}, {"thinking": "maybe"}, {"a": {"b": None}}, {}])
def test_unknown_chat_template_kwargs_never_crash(url, kwargs):
    status, body = post(f"{url}/v1/chat/completions", {**_chat(LYON), "max_tokens": 5, "chat_template_kwargs": kwargs})
    assert status == 200 and body["usage"]["completion_tokens"] == 5


def test_separate_reasoning_false_inlines_it(url):
    r = _expected_reasoning([("user", LYON)])
    _, body = post(f"{url}/v1/chat/completions", {**_chat(LYON), "max_tokens": r + 5, "separate_reasoning": False})
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] is None
    before, after = msg["content"].split(THINK_END)
    assert len(before.split()) == r - 1 and len(after.split()) == 5


def test_without_a_reasoning_parser_the_thinking_is_content(plain_url):
    messages = [("user", LYON)]
    text = render_chat(messages)
    r = reasoning_tokens(load_profile("k26-ar").reasoning, classify(text), prompt_key(text))
    _, body = post(f"{plain_url}/v1/chat/completions", {**_chat(LYON), "max_tokens": r + 4})
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] is None and THINK_END in msg["content"]
    assert body["usage"]["reasoning_tokens"] == 0


# ------------------------------------------------------------------------------ tool calls


def test_tool_call_stream_sdk_and_next_turn(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    question = {"role": "user", "content": "What is the weather in Paris right now?"}
    stream = client.chat.completions.create(
        model="kimi-k2.6",
        messages=[question],
        tools=[WEATHER_TOOL],
        max_tokens=4000,
        stream=True,
        extra_body={"chat_template_kwargs": {"thinking": False}},
    )
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        for tc in choice.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            slot["id"] = slot["id"] or tc.id
            slot["name"] = slot["name"] or tc.function.name
            slot["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    (call,) = calls.values()
    assert call["id"] == "functions.get_weather:0" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    # the agent loop: the tool result comes back, the model answers in text
    follow = client.chat.completions.create(
        model="kimi-k2.6",
        tools=[WEATHER_TOOL],
        max_tokens=6,
        messages=[
            question,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": '{"temp": 21}'},
        ],
        extra_body={"chat_template_kwargs": {"thinking": False}},
    )
    assert follow.choices[0].finish_reason == "length" and not follow.choices[0].message.tool_calls


def test_tool_call_non_stream_after_reasoning(url):
    body = {**_chat("Please look up the weather in Tokyo for me."), "tools": [WEATHER_TOOL], "max_tokens": 30000}
    status, out = post(f"{url}/v1/chat/completions", body)
    assert status == 200
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    (tc,) = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"])["city"] == "Tokyo"
    assert choice["message"]["reasoning_content"]  # it thought first
    assert out["usage"]["completion_tokens"] < 30000  # the call ended the turn


def test_no_call_when_the_prompt_does_not_ask_or_tool_choice_none(url):
    for body in (
        {**_chat("Write a haiku about spring."), "tools": [WEATHER_TOOL]},
        {**_chat("What is the weather in Rome?"), "tools": [WEATHER_TOOL], "tool_choice": "none"},
    ):
        _, out = post(
            f"{url}/v1/chat/completions", {**body, "max_tokens": 8, "chat_template_kwargs": {"thinking": False}}
        )
        assert out["choices"][0]["finish_reason"] == "length"
        assert "tool_calls" not in out["choices"][0]["message"]


def test_required_tool_choice_always_calls(url):
    _, out = post(
        f"{url}/v1/chat/completions",
        {
            **_chat("hi"),
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "max_tokens": 500,
            "chat_template_kwargs": {"thinking": False},
        },
    )
    assert out["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    "tools,tool_choice,kind,needle",
    [
        (
            [{"type": "function", "function": {"description": "no name"}}],
            None,
            "Bad Request",
            "'loc': ('body', 'tools', 0, 'function', 'name'), 'msg': 'Field required'",
        ),
        ([{"type": "function"}], None, "Bad Request", "('body', 'tools', 0, 'function')"),
        ({"not": "a list"}, None, "Bad Request", "'type': 'list_type'"),
        ([{"function": {"name": 3}}], None, "Bad Request", "'type': 'string_type'"),
        ([WEATHER_TOOL], "sometimes", "Bad Request", "('body', 'tool_choice'"),
        (None, "required", "BadRequestError", "Tools cannot be empty if tool choice is set to required."),
        (
            [WEATHER_TOOL],
            {"type": "function", "function": {"name": "nope"}},
            "BadRequestError",
            "Tool 'nope' not found in tools list.",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "banana"}}}],
            None,
            "BadRequestError",
            "Tool 0 function has invalid 'parameters' schema",
        ),
    ],
)
def test_invalid_tools_are_rejected_as_sglang_does(url, tools, tool_choice, kind, needle):
    body = {**_chat("weather in Paris?"), "tools": tools, "stream": True}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    status, err = post(f"{url}/v1/chat/completions", body)
    assert status == 400  # before the stream starts
    assert set(err) == {"object", "message", "type", "param", "code"}
    assert err["type"] == kind and err["param"] is None and needle in err["message"]


def test_invalid_tools_via_sdk_raise_bad_request(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="kimi-k2.6", messages=[{"role": "user", "content": "x"}], tools=[{"type": "function", "function": {}}]
        )


# -------------------------------------------------------------------- usage, prefix cache


def test_continuous_usage_stats_counts_every_chunk(url):
    events = sse(
        f"{url}/v1/chat/completions",
        {
            **_chat(LYON),
            "max_tokens": 60,
            "chat_template_kwargs": {"thinking": False},
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    body = [e for e in events[1:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    counts = [e["usage"]["completion_tokens"] for e in body]
    words = [len(e["choices"][0]["delta"]["content"].split()) for e in body]
    assert counts == sorted(counts) and counts[-1] == 60
    steps = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    assert steps == words  # exact tokens per chunk
    assert all("usage" not in e for e in (events[0], events[-3]))  # role and finish: none


def test_prefix_cache_across_turns_reports_cached_tokens(url):
    history = "Here is a long document about rivers. " * 80  # ~760 prompt tokens
    turn1 = {
        "model": "kimi-k2.6",
        "max_tokens": 16,
        "chat_template_kwargs": {"thinking": False},
        "messages": [{"role": "user", "content": history + "Summarise it."}],
    }
    _, first = post(f"{url}/v1/chat/completions", turn1)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    answer = first["choices"][0]["message"]["content"]
    turn2 = {
        **turn1,
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Now in one line."},
        ],
    }
    _, second = post(f"{url}/v1/chat/completions", turn2)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the whole first turn (prompt and answer) is reused, in whole 64-token blocks
    assert cached % 64 == 0 and cached > first["usage"]["prompt_tokens"] - 64
    assert cached < second["usage"]["prompt_tokens"]
    _, loads = get(f"{url}/v1/loads")
    assert loads["loads"][0]["cache_hit_rate"] > 0.5  # the last prefill batch was turn 2
    status, metrics = 200, None
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert status == 200 and "sglang:cache_hit_rate" in metrics


def test_without_cache_report_prompt_tokens_details_is_null(plain_url):
    _, out = post(
        f"{plain_url}/v1/chat/completions",
        {**_chat("hi"), "max_tokens": 2, "chat_template_kwargs": {"thinking": False}},
    )
    assert out["usage"]["prompt_tokens_details"] is None
    _, loads = get(f"{plain_url}/v1/loads")
    assert loads["loads"][0]["cache_hit_rate"] == 0.0  # SGLang computes it only with metrics on


def test_temperature_is_validated(url):
    status, err = post(f"{url}/v1/chat/completions", {**_chat("x"), "temperature": -1})
    assert status == 400 and "temperature must be a non-negative" in err["message"]
    status, err = post(f"{url}/v1/chat/completions", {**_chat("x"), "top_p": 0})
    assert status == 400 and "top_p must be in (0, 1]" in err["message"]


def test_a_sample_count_the_host_cannot_hold_is_refused(url):
    """Not SGLang's behaviour (it admits any n): the twin's guard, so that one request cannot take
    the memory of the machine it shares with the tests."""
    for n, words in ((0, "at least 1"), (1025, "at most 1024")):
        status, err = post(f"{url}/v1/chat/completions", {**_chat("x"), "n": n})
        assert status == 400 and words in err["message"] and err["param"] == "n"
    for body in ({"prompt": "x", "n": 1025}, {"prompt": "x", "n": 0}):
        status, err = post(f"{url}/v1/completions", {"model": "kimi-k2.6", **body})
        assert status == 400 and err["param"] == "n"


# ------------------------------------------------------------- queue full, first byte


def _raw_stream(url: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )
    return sock


def _wait(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_stream_queue_full_is_200_then_error_event_then_done():
    with twin("k26-ar", "--max-running-requests", "1", "--max-queued-requests", "1") as u:
        long = {**_chat("hi"), "max_tokens": 100000}
        a = _raw_stream(u, long)
        assert a.recv(64).startswith(b"HTTP/1.1 200")  # a is running
        b = _raw_stream(u, long)
        _wait(lambda: get(f"{u}/v1/loads")[1]["loads"][0]["num_waiting_reqs"] == 1)
        # b waits in the queue: its response has not started (headers follow the first token)
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(1)
        events = sse(f"{u}/v1/chat/completions", {**_chat("hi"), "max_tokens": 3})
        assert events[-1] == "[DONE]" and len(events) == 2
        assert events[0] == {
            "error": {
                "object": "error",
                "message": "The request queue is full.",
                "type": "SERVICE_UNAVAILABLE",
                "param": None,
                "code": 503,
            }
        }
        status, err = post(f"{u}/v1/chat/completions", {**_chat("hi"), "max_tokens": 3})
        assert status == 503 and err["type"] == "503"  # non-stream: an HTTP 503
        a.close()
        b.setblocking(True)
        assert b.recv(64).startswith(b"HTTP/1.1 200")  # b got the slot and its first token
        b.close()


def test_native_generate_bad_json_is_flat(url):
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    conn.request("POST", "/generate", body=b"{not json", headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    err = json.loads(resp.read())
    assert resp.status == 400
    assert set(err) == {"object", "message", "type", "param", "code"}
    assert err["type"] == "Bad Request" and "json_invalid" in err["message"]
