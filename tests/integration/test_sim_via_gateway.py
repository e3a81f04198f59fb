"""The twin's K2.6 traffic through the real gateway with the real openai SDK: thinking streams,
tool calls and cached tokens arrive at the client as the twin (and SGLang) sent them."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.test_sim_server import _start
from tests.support import gateway

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp: Path = tmp_path_factory.mktemp("gw")
    for twin_url in _start(
        "k26-dflash", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-cache-report"
    ):
        backends = [{"name": "dflash", "url": twin_url, "model": "kimi-k2.6", "strategy": "dflash"}]
        with gateway(tmp, backends) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="x")


def test_thinking_stream_through_the_gateway(client):
    stream = client.chat.completions.create(
        model="kimi-k2.6",
        messages=[{"role": "user", "content": "Tell me about Lyon."}],
        max_tokens=2500,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, usage = "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert reasoning and content
    assert usage.model_extra["reasoning_tokens"] == len(reasoning.split()) + 1


def test_tool_call_through_the_gateway(client):
    out = client.chat.completions.create(
        model="kimi-k2.6",
        tools=[WEATHER],
        max_tokens=4000,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id == "functions.get_weather:0"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def _decode_samples(client: openai.OpenAI) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(str(client.base_url).removesuffix("/v1/") + "/metrics", timeout=10).read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        if f.name == "specroute_decode_tokens_per_second"
        for s in f.samples
        if s.name.endswith("_count")
    )


def test_a_streamed_tool_call_gets_no_decode_speed(client):
    """SGLang's tool parser holds a call's tokens back until it can parse them: the chunks arrive
    late and together, and a decode speed from their times was three times the server's."""
    before = _decode_samples(client)
    ask = {"model": "kimi-k2.6", "max_tokens": 4000, "stream": True, "stream_options": {"include_usage": True}}
    chunks = list(
        client.chat.completions.create(
            **ask, tools=[WEATHER], tool_choice="required", messages=[{"role": "user", "content": "Paris weather?"}]
        )
    )
    assert any(c.choices and c.choices[0].finish_reason == "tool_calls" for c in chunks)
    assert _decode_samples(client) == before
    list(client.chat.completions.create(**ask, messages=[{"role": "user", "content": "Tell me about Lyon."}]))
    assert _decode_samples(client) == before + 1  # a text stream is timed


def test_cached_tokens_through_the_gateway(client):
    history = [{"role": "user", "content": "A long story about rivers. " * 60}]
    first = client.chat.completions.create(
        model="kimi-k2.6", messages=history, max_tokens=8, extra_body={"chat_template_kwargs": {"thinking": False}}
    )
    second = client.chat.completions.create(
        model="kimi-k2.6",
        max_tokens=8,
        extra_body={"chat_template_kwargs": {"thinking": False}},
        messages=[
            *history,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Shorter."},
        ],
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 64
