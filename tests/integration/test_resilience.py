"""Failure behaviour over real processes: failover, circuit, chaos, overload, drain, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import aiohttp
import openai
import pytest

from tests.conftest import TEST_TIME_SCALE
from tests.support import free_port, gateway, get_json, open_stream, specroute, wait_until
from tools.processes import spawn, wait_ready

MSG = [{"role": "user", "content": "Tell me about the history of Rome."}]


class Twin:
    """A twin we can kill and restart on the same port."""

    def __init__(self, profile: str = "k26-ar", *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = specroute(
            "sim", "--profile", profile, "--port", str(self.port), "--time-scale", TEST_TIME_SCALE, *extra
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> Twin:
        self.proc = spawn(self.cmd)
        wait_ready(f"{self.url}/ready", proc=self.proc, timeout_s=30)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def entry(self, name: str, model: str = "kimi-k2.6", strategy: str = "ar") -> dict:
        return {"name": name, "url": self.url, "model": model, "strategy": strategy}


@pytest.fixture
def twins():
    started: list[Twin] = []

    def make(profile: str = "k26-ar", *extra: str) -> Twin:
        twin = Twin(profile, *extra).start()
        started.append(twin)
        return twin

    yield make
    for t in started:
        t.kill()


async def _chat(
    session: aiohttp.ClientSession,
    url: str,
    *,
    stream: bool,
    max_tokens: int,
    model: str = "kimi-k2.6",
    headers: dict | None = None,
    on_stream_start=None,
) -> dict:
    # ignore_eos: the answer runs its whole budget (the twin ends an answer at its EOS otherwise)
    body = {"model": model, "messages": MSG, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}) as r:
        if stream and on_stream_start is not None and r.status == 200:
            # the gateway sends the status line only with the first upstream byte: from here on no retry
            on_stream_start(r.headers.get("x-specroute-backend"))
        raw = await r.read()
        result = {
            "status": r.status,
            "backend": r.headers.get("x-specroute-backend"),
            "retry_after": r.headers.get("retry-after"),
            "raw": raw,
        }
    if stream and result["status"] == 200:
        events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
        result["done"] = events[-1] == "[DONE]" if events else False
        parsed = [json.loads(e) for e in events if e != "[DONE]"]
        result["error"] = next((p["error"] for p in parsed if "error" in p), None)
        result["words"] = sum(
            len((p["choices"][0]["delta"].get("content") or "").split()) for p in parsed if p.get("choices")
        )
        result["usage"] = next((p["usage"] for p in parsed if p.get("usage")), None)
    elif result["status"] != 200:
        result["error"] = json.loads(raw)["error"]
    return result


def test_failing_backend_costs_no_request_and_opens_its_circuit(tmp_path, twins):
    good = twins("k26-ar")
    bad = twins("k26-ar", "--fault-error-rate", "1.0", "--fault-error-status", "502")
    dead_port = free_port()
    backends = [
        good.entry("good"),
        bad.entry("bad"),
        {"name": "dead", "url": f"http://127.0.0.1:{dead_port}", "model": "kimi-k2.6", "strategy": "ar"},
    ]
    # every backend may be ejected: the share that may not is tested on its own (tests/integration/test_security.py)
    extra = "[health]\ncircuit_failures = 2\ncircuit_cooldown_s = 60\nmax_ejected_share = 1.0\n"
    with gateway(tmp_path, backends, extra) as url:

        async def run() -> list[dict]:
            async with aiohttp.ClientSession() as s:
                return await asyncio.gather(*(_chat(s, url, stream=i % 2 == 0, max_tokens=8) for i in range(40)))

        results = asyncio.run(run())
        state = get_json(f"{url}/admin/backends")
    assert [r["status"] for r in results] == [200] * 40
    assert {r["backend"] for r in results} == {"good"}
    assert state["retries"] >= 1
    by_name = {b["name"]: b for b in state["backends"]}
    assert by_name["bad"]["circuit"] == "open"
    assert by_name["dead"]["circuit"] == "open" or not by_name["dead"]["ready"]
    assert state["inflight"] == 0


def test_pinned_backend_that_is_down_is_503_not_rerouted(tmp_path, twins):
    good = twins("k26-ar")
    dead_port = free_port()
    backends = [
        good.entry("good"),
        {"name": "dead", "url": f"http://127.0.0.1:{dead_port}", "model": "kimi-k2.6", "strategy": "ar"},
    ]
    with gateway(tmp_path, backends, "[health]\ninterval_s = 0.1\n") as url:
        assert wait_until(
            lambda: not {b["name"]: b for b in get_json(f"{url}/admin/backends")["backends"]}["dead"]["ready"]
        )

        async def run() -> dict:
            async with aiohttp.ClientSession() as s:
                return await _chat(s, url, stream=False, max_tokens=4, model="kimi-k2.6@dead")

        result = asyncio.run(run())
    assert result["status"] == 503
    assert result["error"]["message"].startswith("backend 'dead' is not available (down")


def test_chaos_kill_and_restart_a_backend_under_load(tmp_path, twins):
    a, b = twins("k26-ar"), twins("k26-ar")
    extra = "[health]\ninterval_s = 0.2\nunhealthy_after = 1\ncircuit_failures = 1\ncircuit_cooldown_s = 0.5\n"
    with gateway(tmp_path, [a.entry("a"), b.entry("b")], extra) as url:

        async def run() -> list[dict]:
            async with aiohttp.ClientSession() as s:
                results: list[dict] = []
                stop_at = 160
                streams_started_on_a: list[int] = []
                a_is_streaming = asyncio.Event()

                def stream_started(backend: str | None) -> None:
                    if backend == "a":
                        streams_started_on_a.append(1)
                        if len(streams_started_on_a) >= 4:
                            a_is_streaming.set()

                async def worker(i: int) -> None:
                    while len(results) < stop_at:
                        results.append(
                            await _chat(s, url, stream=i % 2 == 0, max_tokens=300, on_stream_start=stream_started)
                        )

                async def killer() -> None:
                    # kill `a` while streams that already sent bytes are on it, not after a fixed time
                    await a_is_streaming.wait()
                    a.kill()

                kill = asyncio.create_task(killer())
                await asyncio.gather(*(worker(i) for i in range(32)))
                kill.cancel()  # never hang: if the kill did not happen, the assertions below say so
                return results

        results = asyncio.run(run())
        non_stream = [r for r in results if "done" not in r]
        streams = [r for r in results if "done" in r]
        assert all(r["status"] == 200 for r in results), {r["status"] for r in results}
        # zero failed non-streaming requests: they were retried on b before anything reached the client
        assert non_stream and all(json.loads(r["raw"])["usage"]["completion_tokens"] == 300 for r in non_stream)
        broken = [r for r in streams if r["error"]]
        assert broken, "the kill should have cut some streams"
        for r in broken:  # only streams on the killed backend, each ended properly, nothing duplicated
            assert r["backend"] == "a" and r["done"] and r["words"] < 300
        for r in streams:
            if not r["error"]:
                assert r["usage"]["completion_tokens"] == 300 and r["words"] == 300 and r["done"]
        # restart on the same port: traffic comes back within the health interval
        a.start()
        assert wait_until(lambda: {x["name"]: x for x in get_json(f"{url}/admin/backends")["backends"]}["a"]["up"])

        async def after() -> list[dict]:
            async with aiohttp.ClientSession() as s:
                return await asyncio.gather(*(_chat(s, url, stream=False, max_tokens=4) for _ in range(20)))

        served = {r["backend"] for r in asyncio.run(after())}
        assert "a" in served, json.dumps(get_json(f"{url}/admin/backends"), indent=1)[:6000]
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def _gateway_pid(port: int) -> int:
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(out.split("pid=")[1].split(",")[0])


def test_overload_gets_only_200_or_429_with_retry_after(tmp_path, twins):
    a, b = twins("k26-ar"), twins("k26-ar")
    extra = "[admission]\nmax_inflight = 64\nmax_queue = 64\nqueue_timeout_s = 0.3\n"
    with gateway(tmp_path, [a.entry("a"), b.entry("b")], extra) as url:

        async def burst() -> list[dict]:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as s:
                return await asyncio.gather(*(_chat(s, url, stream=i % 3 == 0, max_tokens=40) for i in range(500)))

        pid = _gateway_pid(int(url.rsplit(":", 1)[1]))
        first = asyncio.run(burst())
        rss_after_first = _rss_kb(pid)
        second = asyncio.run(burst())
        rss_after_second = _rss_kb(pid)
        state = get_json(f"{url}/admin/backends")
    for results in (first, second):
        statuses = [r["status"] for r in results]
        assert set(statuses) <= {200, 429}
        assert statuses.count(200) >= 64 and statuses.count(429) >= 1
        for r in results:
            if r["status"] == 429:
                assert r["retry_after"] and r["error"]["type"] == "rate_limit_error"
    assert state["inflight"] == 0 and state["waiting"] == 0
    assert rss_after_second < rss_after_first * 1.10, (rss_after_first, rss_after_second)


def test_drain_stops_new_requests_and_lets_inflight_finish(tmp_path, twins):
    a, b = twins("k26-ar"), twins("k26-ar")
    with gateway(tmp_path, [a.entry("a"), b.entry("b")]) as url:

        async def run() -> tuple[dict, list[dict]]:
            async with aiohttp.ClientSession() as s:
                long_stream = asyncio.create_task(_chat(s, url, stream=True, max_tokens=600, model="kimi-k2.6@a"))

                def streaming_on_a() -> bool:
                    backends = get_json(f"{url}/admin/backends")["backends"]
                    return any(x["name"] == "a" and x["inflight"] == 1 for x in backends)

                assert await asyncio.to_thread(wait_until, streaming_on_a)
                async with s.post(f"{url}/admin/backends/a/drain", json={}) as r:
                    assert r.status == 200 and (await r.json())["draining"]
                others = await asyncio.gather(*(_chat(s, url, stream=False, max_tokens=4) for _ in range(20)))
                return await long_stream, others

        finished, others = asyncio.run(run())
    assert finished["status"] == 200 and not finished["error"] and finished["usage"]["completion_tokens"] == 600
    assert {r["backend"] for r in others} == {"b"}


def test_client_disconnect_aborts_the_upstream_request(tmp_path, twins):
    a = twins("k26-ar")
    with gateway(tmp_path, [a.entry("a")]) as url:

        def running():
            return get_json(f"{a.url}/v1/loads")["loads"][0]["num_running_reqs"]

        with open_stream(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 5000, "stream": True}):
            assert wait_until(lambda: running() == 1)
        # the twin, like SGLang, aborts a request whose connection closed
        assert wait_until(lambda: running() == 0)
        assert get_json(f"{url}/admin/backends")["inflight"] == 0


def test_stalled_stream_ends_with_an_error_event_after_idle_stream_s(tmp_path, twins):
    """A backend that stops sending mid-stream: after timeouts.idle_stream_s of silence the client
    gets an SSE error event and [DONE], and the gateway is left with nothing in flight."""
    hung = twins("k26-ar", "--fault-hang-after-tokens", "5")
    with gateway(tmp_path, [hung.entry("hung")], "[timeouts]\nidle_stream_s = 0.5\n") as url:

        async def run() -> tuple[dict, float]:
            async with aiohttp.ClientSession() as s:
                t0 = asyncio.get_running_loop().time()
                result = await _chat(s, url, stream=True, max_tokens=200)
                return result, asyncio.get_running_loop().time() - t0

        result, elapsed = asyncio.run(run())
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0)
    assert result["status"] == 200 and result["done"]
    assert "upstream stream idle for more than 0.5s" in result["error"]["message"]
    assert 0.5 <= elapsed < 5


def test_a_stalled_responses_stream_ends_with_response_failed_as_sglang_ends_one(tmp_path, twins):
    """A Responses stream the gateway must cut ends in the Responses API's own shape (SGLang's
    `response.failed`, numbered after the events sent), which the openai SDK reads as a typed event,
    not in chat's error-then-[DONE] shape."""
    hung = twins("k26-ar", "--fault-hang-after-tokens", "5")
    with gateway(tmp_path, [hung.entry("hung")], "[timeouts]\nidle_stream_s = 0.5\n") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        events = list(client.responses.create(model="kimi-k2.6", input="Tell me about Rome.", stream=True))
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0)
    assert [e.type for e in events[:1]] == ["response.created"]
    assert any(e.type == "response.output_text.delta" for e in events)
    last = events[-1]
    assert last.type == "response.failed", [e.type for e in events]
    assert last.response.status == "failed" and last.response.error is not None
    assert last.response.error.code == "server_error"
    assert "upstream stream idle for more than 0.5s" in last.response.error.message
    assert last.response.id == events[0].response.id
    # the response `response.created` announced, failed: its creation time, model and request fields kept
    created = events[0].response
    assert (last.response.created_at, last.response.model) == (created.created_at, created.model)
    assert last.response.tools == created.tools and last.response.output == []
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_streamed_queue_full_answer_is_retried_like_a_503(tmp_path, twins):
    """SGLang answers a stream that finds its queue full with HTTP 200, an error event with code
    503, then [DONE]. Nothing has reached the client yet: the gateway tries another backend, and
    counts it as busy, not broken (the circuit stays closed)."""
    full, spare = twins("k26-ar", "--max-queued-requests", "0"), twins("k26-ar")
    backends = [full.entry("full"), spare.entry("spare")]
    with gateway(tmp_path, backends, gateway_keys='policy = "round_robin"\n') as url:

        async def run() -> list[dict]:
            async with aiohttp.ClientSession() as s:
                return [await _chat(s, url, stream=i % 3 != 0, max_tokens=8) for i in range(8)]

        results = asyncio.run(run())
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        state = {b["name"]: b for b in get_json(f"{url}/admin/backends")["backends"]}
    assert all(r["status"] == 200 and r["backend"] == "spare" for r in results), results
    streams = [r for r in results if "done" in r]
    assert streams and all(r["done"] and r["error"] is None and r["usage"]["completion_tokens"] == 8 for r in streams)
    assert 'specroute_upstream_errors_total{backend="full",kind="stream_503"}' in metrics
    assert state["full"]["circuit"] == "closed"


@contextlib.contextmanager
def _hung_and_spare(
    tmp_path, twins, config: str
) -> Iterator[tuple[str, Twin, Callable[[], dict[str, dict]], socket.socket]]:
    """A round-robin gateway over `hung` (its engine stops after 5 tokens) and `spare`, both up and
    past an engine check; yields its URL, the hung twin, a reader of /admin/backends by name, and
    the socket of a stream pinned to `hung`, which runs until its engine stops and stays open."""
    hung = twins("k26-ar", "--fault-hang-after-tokens", "5")
    spare = twins("k26-ar")
    with gateway(
        tmp_path, [hung.entry("hung"), spare.entry("spare")], config, gateway_keys='policy = "round_robin"\n'
    ) as url:

        def state() -> dict[str, dict]:
            return {b["name"]: b for b in get_json(f"{url}/admin/backends")["backends"]}

        assert wait_until(lambda: all(b["engine_ok"] and b["up"] for b in state().values()))
        body = {"model": "kimi-k2.6@hung", "messages": MSG, "max_tokens": 200, "stream": True}
        with open_stream(url, body, events=2) as stream:
            yield url, hung, state, stream


async def _chats(url: str, n: int, *, together: bool) -> list[dict]:
    """`n` chat requests, streamed and not in turn; one after another, or all at once."""
    async with aiohttp.ClientSession() as s:
        calls = [_chat(s, url, stream=i % 2 == 0, max_tokens=8) for i in range(n)]
        if together:
            return list(await asyncio.gather(*calls))
        return [await c for c in calls]


def test_a_hung_engine_leaves_the_pool_by_sglangs_engine_check(tmp_path, twins):
    """A backend whose engine hangs keeps answering /ready 200 (as SGLang does): only SGLang's
    /health_generate notices, by no batch finishing. The gateway runs that check, takes the
    backend out when it fails, and new requests go to the others (round robin would send every
    other one to it)."""
    health = "[health]\ninterval_s = 0.1\nengine_check_s = 0.2\nengine_check_timeout_s = 10\n"
    with _hung_and_spare(tmp_path, twins, health) as (url, hung, state, stream):
        assert wait_until(lambda: state()["hung"]["engine_ok"] is False, timeout=30)
        # the stream under way there ends now, with an error event, not after idle_stream_s (60 s)
        rest = b""
        while b"[DONE]" not in rest:
            part = stream.recv(65536)
            assert part, rest
            rest += part
        assert b"engine check failed" in rest, rest
        now = state()
        assert not now["hung"]["up"] and now["spare"]["up"] and now["spare"]["engine_ok"]
        results = asyncio.run(_chats(url, 6, together=False))
        assert [(r["status"], r["backend"]) for r in results] == [(200, "spare")] * 6, results
        # the twin, like SGLang, now says so on /ready as well
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{hung.url}/ready", timeout=5)
        assert e.value.code == 503


def test_requests_waiting_on_a_hung_engine_move_to_another_backend_when_its_check_fails(tmp_path, twins):
    """Requests sent to a backend just as its engine hangs never get a token there. Nothing of them
    has reached the client, so once SGLang's engine check fails they are tried on another backend,
    rather than waiting out first_byte_s (or SGLang's watchdog, 300 s by default)."""
    config = (
        "[health]\ninterval_s = 0.1\nengine_check_s = 1.0\nengine_check_timeout_s = 10\n"
        "[timeouts]\nfirst_byte_s = 240\nrequest_s = 240\n"
    )
    with _hung_and_spare(tmp_path, twins, config) as (url, _hung, _state, _stream):
        results = asyncio.run(_chats(url, 4, together=True))
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    assert [(r["status"], r["backend"]) for r in results] == [(200, "spare")] * 4, results
    assert all(r["error"] is None for r in results if "done" in r)
    moved = [
        line
        for line in metrics.splitlines()
        if line.startswith("specroute_upstream_errors_total") and 'kind="engine_stalled"' in line
    ]
    assert moved and float(moved[0].split()[-1]) >= 1, moved  # round robin sent some of them to the hung one


def test_a_restarted_backend_is_not_credited_with_the_prefixes_it_held(tmp_path, twins):
    """A restart empties SGLang's radix cache. Once the backend is back, the policy must not count
    on the conversation prefixes it held before (it would price their re-prefill at nothing). A
    restart may also change the server's flags: its cap follows the new /server_info."""
    a = twins("k26-dflash")  # its /server_info carries max_running_requests (48)
    config = "[health]\ninterval_s = 0.1\nunhealthy_after = 1\n"
    with gateway(tmp_path, [a.entry("a", strategy="dflash")], config) as url:

        def held() -> int:
            entry = get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["backends"].get("a", {})
            return entry.get("prefix_blocks", {}).get("blocks", 0)

        def ready() -> bool:
            return get_json(f"{url}/admin/backends")["backends"][0]["ready"]

        def cap() -> int:
            return get_json(f"{url}/admin/backends")["backends"][0]["cap"]

        system = {"role": "system", "content": "You are a careful assistant who cites sources. " * 60}
        body = {"model": "kimi-k2.6", "messages": [system, *MSG], "max_tokens": 4}
        urllib.request.urlopen(
            urllib.request.Request(
                f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            ),
            timeout=30,
        ).read()
        assert wait_until(lambda: held() > 0) and wait_until(lambda: cap() == 48)
        a.kill()
        assert wait_until(lambda: not ready())
        a.cmd = [*a.cmd, "--max-running-requests", "7"]
        a.start()
        assert wait_until(ready)
        assert held() == 0
        assert wait_until(lambda: cap() == 7)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_crashes_the_servers_it_reaches_costs_two_of_them_not_the_pool(tmp_path, twins, stream):
    """A query of death: the twins exit when a prompt holds POISON. Without the quarantine the
    gateway retried it on every backend (retry.attempts: 3), and the client's SDK sent it again."""
    pool = [twins("k26-ar", "--fault-crash-on-prompt", "POISON") for _ in range(3)]
    backends = [t.entry(f"t{i}") for i, t in enumerate(pool)]
    with gateway(tmp_path, backends) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=2)  # the SDK retries too
        poison = [{"role": "user", "content": "Tell me about POISON."}]
        for _ in range(2):  # the second time, as a client resending it: refused at once
            with pytest.raises(openai.UnprocessableEntityError) as info:
                if stream:
                    list(client.chat.completions.create(model="kimi-k2.6", messages=poison, max_tokens=4, stream=True))
                else:
                    client.chat.completions.create(model="kimi-k2.6", messages=poison, max_tokens=4)
            assert info.value.code == "request_quarantined" and "2 backends" in str(info.value)
        assert sum(t.proc.poll() is not None for t in pool) == 2  # the third never saw it
        answer = client.chat.completions.create(model="kimi-k2.6", messages=MSG, max_tokens=4)
        assert answer.usage.completion_tokens == 4  # the survivor serves everyone else
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    assert 'kind="lost"' in metrics
