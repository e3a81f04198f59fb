"""Routing through a running gateway: policy choice per request, introspection, in-flight accounting."""

from __future__ import annotations

import asyncio
import collections
import json

import aiohttp
import openai
import pytest

from tests.support import gateway, get_json, wait_until

MATH = [{"role": "user", "content": "A train travels 60 miles in 1.5 hours. How many miles per hour is that?"}]


def _k26(twin_factory, *extra_ar: str) -> list[dict]:
    return [
        {"name": "k26-ar", "url": twin_factory("k26-ar", *extra_ar), "model": "kimi-k2.6", "strategy": "ar"},
        {"name": "k26-dflash", "url": twin_factory("k26-dflash"), "model": "kimi-k2.6", "strategy": "dflash"},
    ]


def test_goodput_sends_math_at_low_load_to_speculation_and_explains_itself(tmp_path, twin_factory):
    with gateway(tmp_path, _k26(twin_factory)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        served = collections.Counter(
            client.chat.completions.with_raw_response.create(
                model="kimi-k2.6", messages=MATH, max_tokens=32, stream=False
            ).headers["x-specroute-backend"]
            for _ in range(30)
        )
        state = get_json(f"{url}/admin/backends")
    assert served["k26-dflash"] >= 24, served  # sequential math: speculation wins; a few explorations allowed
    policy = state["policies"]["kimi-k2.6"]
    assert policy["name"] == "goodput" and policy["policy"]["objective"] == "latency"
    dflash = policy["backends"]["k26-dflash"]
    assert (
        dflash["accept_length"]["math"] > 2
        and dflash["predicted_tok_s"]["math"] > policy["backends"]["k26-ar"]["predicted_tok_s"]["math"]
    )


def test_policy_header_needs_the_operators_permission(tmp_path, twin_factory):
    backends = _k26(twin_factory)
    with gateway(tmp_path, backends) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.PermissionDeniedError) as info:
            client.chat.completions.create(
                model="kimi-k2.6", messages=MATH, max_tokens=2, extra_headers={"x-specroute-policy": "round_robin"}
            )
        assert "allow_policy_header" in info.value.message
    with gateway(tmp_path, backends, gateway_keys="allow_policy_header = true\n") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        names = [
            client.chat.completions.with_raw_response.create(
                model="kimi-k2.6", messages=MATH, max_tokens=2, extra_headers={"x-specroute-policy": "round_robin"}
            ).headers["x-specroute-backend"]
            for _ in range(4)
        ]
        assert sorted(names) == ["k26-ar", "k26-ar", "k26-dflash", "k26-dflash"]  # round robin, not goodput
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="kimi-k2.6", messages=MATH, max_tokens=2, extra_headers={"x-specroute-policy": "fastest"}
            )


def test_per_model_policy_options_from_config(tmp_path, twin_factory):
    extra = '[models."kimi-k2.6"]\npolicy = "threshold"\nthreshold = 1\n'
    with gateway(tmp_path, _k26(twin_factory), extra) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        # threshold 1: speculative only while nothing is in flight -> sequential requests go to dflash
        names = {
            client.chat.completions.with_raw_response.create(model="kimi-k2.6", messages=MATH, max_tokens=2).headers[
                "x-specroute-backend"
            ]
            for _ in range(4)
        }
        assert names == {"k26-dflash"}
        assert get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["name"] == "threshold"


def test_inflight_is_released_on_midstream_crash_and_on_disconnect_while_queued(tmp_path, twin_factory):
    backends = [
        {"name": "steady", "url": twin_factory("k26-ar"), "model": "kimi-k2.6", "strategy": "ar"},
        {
            "name": "crashy",
            "url": twin_factory("k26-ar", "--fault-crash-after-tokens", "5"),
            "model": "kimi-k2.6",
            "strategy": "ar",
        },
    ]

    def state():
        return get_json(f"{url}/admin/backends")

    with gateway(tmp_path, backends, "[admission]\nmax_inflight = 1\nqueue_timeout_s = 30\n") as url:

        async def scenario() -> tuple[str, str]:
            async with aiohttp.ClientSession() as s:

                def body(pin, n):
                    return {"model": f"kimi-k2.6@{pin}", "messages": MATH, "max_tokens": n, "stream": True}

                holder = await s.post(f"{url}/v1/chat/completions", json=body("steady", 3000))
                await holder.content.readany()
                # the only slot is taken: a second request waits in the queue, then its client leaves
                waiting = asyncio.create_task(s.post(f"{url}/v1/chat/completions", json=body("crashy", 50)))
                assert await asyncio.to_thread(wait_until, lambda: state()["waiting"] == 1)
                waiting.cancel()
                assert await asyncio.to_thread(wait_until, lambda: state()["waiting"] == 0)
                held = (await holder.read()).decode()
                async with s.post(f"{url}/v1/chat/completions", json=body("crashy", 50)) as crashed:
                    return held, (await crashed.read()).decode()

        held, crashed = asyncio.run(scenario())
        assert held.rstrip().endswith("data: [DONE]") and '"error"' not in held
        # the twin died after 5 tokens: the stream ends with an OpenAI-shaped error event, then [DONE]
        events = [e[6:] for e in crashed.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
        assert wait_until(lambda: state()["inflight"] == 0 and state()["waiting"] == 0)
        assert [b["inflight"] for b in state()["backends"]] == [0, 0]


class _Recorder:
    """A policy that takes the first candidate and keeps what the gateway told it."""

    name = "recorder"

    def __init__(self) -> None:
        self.features: list = []
        self.outcomes: list = []

    def choose(self, request, candidates):
        from policies import Decision

        self.features.append(request)
        return Decision(backend=candidates[0], reason="first")

    def observe(self, outcome) -> None:
        self.outcomes.append(outcome)


async def _serve_once(proxy, body: dict, kind: str = "chat") -> bytes:
    """One request through `Proxy.serve` over an in-memory ASGI channel (the upstream is real)."""
    from gateway.downstream import Downstream

    sent: list[dict] = []
    never = asyncio.Event()

    async def receive() -> dict:
        await never.wait()  # the client stays; the watch cancels nothing
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await proxy.serve(json.dumps(body).encode(), kind, {}, None, Downstream(receive, send))
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _recorded_proxy(url: str):
    from backends import BackendSpec, Strategy
    from backends.client import SGLangClient
    from gateway.access_log import AccessLog
    from gateway.admission import Admission
    from gateway.config import config_from_dict
    from gateway.pool import Backend, Pools
    from gateway.proxy import Proxy

    spec = BackendSpec(name="d", url=url, model="kimi-k2.6", strategy=Strategy.DFLASH)
    pools = Pools([Backend(spec, SGLangClient(spec))])
    recorder = _Recorder()
    proxy = Proxy(
        pools,
        Admission(pools, max_inflight=4, max_queue=4, queue_timeout_s=5),
        {"kimi-k2.6": recorder},
        config_from_dict({}),
        access_log=AccessLog(False),
    )
    return pools, recorder, proxy


def test_a_token_id_prompt_is_counted_and_chained_in_the_caches_own_blocks(twin_factory):
    from policies.prefix import BLOCK_TOKENS, token_blocks

    url = twin_factory("k26-dflash", "--enable-cache-report")
    ids = list(range(1000, 1000 + 5 * BLOCK_TOKENS + 10))
    follow_up = [*ids, *range(7, 7 + 2 * BLOCK_TOKENS)]

    async def run():
        pools, recorder, proxy = _recorded_proxy(url)
        try:
            for prompt in (ids, follow_up):
                body = {"model": "kimi-k2.6", "prompt": prompt, "max_tokens": 16, "n": 2}
                await _serve_once(proxy, body, "completion")
        finally:
            await pools.close()
        return recorder

    recorder = asyncio.run(run())
    first, second = recorder.features
    assert first.prompt_tokens == len(ids) and second.prompt_tokens == len(follow_up)  # exact, not text / 4
    assert first.prefix == token_blocks(ids) and len(first.prefix) == 5
    assert second.prefix[:5] == first.prefix and len(second.prefix) == 7  # the shared blocks agree
    done = recorder.outcomes
    assert [o.sequences for o in done] == [2, 2] and [o.completion_tokens for o in done] == [32, 32]
    assert done[1].cached_tokens and done[1].cached_tokens >= 5 * BLOCK_TOKENS


def test_the_policy_gets_the_requests_features_and_learns_cached_and_reasoning_tokens(twin_factory):
    from policies.prefix import message_blocks

    url = twin_factory("k26-dflash", "--reasoning-parser", "kimi_k2", "--enable-cache-report")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "look a word up",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    history = [
        {"role": "system", "content": "You answer questions about rail travel. " * 40},
        {"role": "user", "content": "A train travels 60 miles in 1.5 hours. What is its speed?"},
    ]
    body = {
        "model": "kimi-k2.6",
        "messages": history,
        "max_tokens": 64,
        "temperature": 0.7,
        "tools": tools,
        "chat_template_kwargs": {"thinking": True},
    }

    async def run() -> tuple[_Recorder, list[bytes]]:
        pools, recorder, proxy = _recorded_proxy(url)
        try:
            answers = [await _serve_once(proxy, body) for _ in range(2)]  # the second finds its prefix cached
        finally:
            await pools.close()
        return recorder, answers

    recorder, answers = asyncio.run(run())
    assert all(json.loads(a)["usage"]["completion_tokens"] == 64 for a in answers)
    f = recorder.features[0]
    assert (f.temperature, f.thinking, f.tools, f.domain.value) == (0.7, True, True, "math")
    assert f.prefix and f.prefix == message_blocks(history)
    first, second = recorder.outcomes
    assert first.features == f and first.reasoning_tokens and first.reasoning_tokens > 0
    assert second.cached_tokens and second.cached_tokens > (first.cached_tokens or 0)
