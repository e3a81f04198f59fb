"""Hot reload (SIGHUP and POST /admin/reload) and the admin API, with streams in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from common.admin_api import decode_admin_backends
from gateway.config import config_from_dict
from gateway.runtime import Runtime
from tests.support import free_port, gateway_config, get_json, output, running, specroute, wait_until

MSG = [{"role": "user", "content": "Tell me a story."}]


def _post(url: str, body: dict | None = None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def _stream(url: str, model: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": MSG,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/chat/completions", json=body) as r:
        raw = (await r.read()).decode()
    events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
    parsed = [json.loads(e) for e in events if e != "[DONE]"]
    return {
        "done": events[-1] == "[DONE]",
        "error": any("error" in p for p in parsed),
        "tokens": next((p["usage"]["completion_tokens"] for p in parsed if p.get("usage")), 0),
    }


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return r.read().decode()


def _entry(name: str, url: str, strategy: str = "ar") -> dict:
    return {"name": name, "url": url, "model": "kimi-k2.6", "strategy": strategy}


@contextlib.contextmanager
def _gateway_over(tmp_path: Path, backend: str) -> Iterator[tuple[str, Path, int, subprocess.Popen]]:
    """`specroute serve` from a config file (the tests rewrite it to reload) with backend `a` at
    `backend`: yields the gateway's URL, the file, its port and the process."""
    port = free_port()
    path = tmp_path / "g.toml"
    path.write_text(gateway_config(port, [_entry("a", backend)]))
    url = f"http://127.0.0.1:{port}"
    with running(specroute("serve", "--config", str(path)), ready_url=f"{url}/health") as proc:
        yield url, path, port, proc


def test_reload_adds_and_removes_backends_without_cutting_streams(tmp_path, twin_factory):
    a, b = twin_factory("k26-ar"), twin_factory("k26-ar")
    with _gateway_over(tmp_path, a) as (url, path, port, proc):

        async def scenario() -> tuple[dict, dict]:
            stream = asyncio.create_task(_stream(url, "kimi-k2.6@a", 800))
            assert await asyncio.to_thread(wait_until, lambda: get_json(f"{url}/admin/backends")["inflight"] == 1)
            # swap a for b in the file; SIGHUP re-reads it
            path.write_text(gateway_config(port, [_entry("b", b)]))
            os.kill(proc.pid, signal.SIGHUP)
            assert await asyncio.to_thread(
                wait_until, lambda: [x["name"] for x in get_json(f"{url}/admin/backends")["backends"]] == ["b"]
            )
            state = get_json(f"{url}/admin/backends")
            return await stream, state

        finished, state = asyncio.run(scenario())
        assert finished == {"done": True, "error": False, "tokens": 800}  # the removed backend's stream finished
        assert [r["name"] for r in state["retiring"]] == ["a"]
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["retiring"] == [])
        status, _ = _post(f"{url}/v1/chat/completions", {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 2})
        assert status == 200
        # an invalid config is refused with the reason; the running one stays
        path.write_text('[gateway]\npolicy = "fastest"\n')
        status, body = _post(f"{url}/admin/reload")
        assert status == 400 and "fastest" in body["error"]["message"]
        assert [x["name"] for x in get_json(f"{url}/admin/backends")["backends"]] == ["b"]
        # a policy change applies to new requests
        path.write_text(gateway_config(port, [_entry("b", b)], '[models."kimi-k2.6"]\npolicy = "round_robin"\n'))
        status, body = _post(f"{url}/admin/reload")
        assert status == 200 and body == {"added": [], "removed": []}
        assert get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["name"] == "round_robin"


def test_reload_keeps_an_unchanged_policy_and_rebuilds_a_changed_one():
    """A policy keeps what it learned across a reload that does not change its name or options."""

    def config(extra_models: dict) -> dict:
        return {"backends": [_entry("a", "http://127.0.0.1:9")], "models": extra_models}

    async def scenario() -> None:
        rt = Runtime(config_from_dict(config({})))
        try:
            first = rt.policies["kimi-k2.6"]
            await rt.reload(config_from_dict(config({})))
            assert rt.policies["kimi-k2.6"] is first
            await rt.reload(config_from_dict(config({"kimi-k2.6": {"policy": "round_robin"}})))
            changed = rt.policies["kimi-k2.6"]
            assert changed is not first and changed.name == "round_robin"
            await rt.reload(config_from_dict(config({"kimi-k2.6": {"policy": "round_robin"}})))
            assert rt.policies["kimi-k2.6"] is changed
        finally:
            await rt.stop()

    asyncio.run(scenario())


def test_a_backend_removed_by_reload_leaves_no_tracked_prefixes_behind():
    """The prefix tracker holds a backend's blocks up to its KV budget; a removed backend's must go
    with it, or backends added and removed under new names would pile them up."""
    from policies import RequestFeatures
    from policies.prefix import message_blocks

    entries = [_entry("a", "http://127.0.0.1:9"), _entry("b", "http://127.0.0.1:9")]
    history = [{"role": "system", "content": "You are a careful assistant. " * 200}, *MSG]
    request = RequestFeatures(model="kimi-k2.6", prompt_tokens=1500, prefix=message_blocks(history))

    async def scenario() -> tuple[dict, dict]:
        rt = Runtime(config_from_dict({"backends": entries}))
        try:
            policy = rt.policies["kimi-k2.6"]
            for name in ("a", "b"):  # each one alone: the prefix is recorded on both
                policy.choose(request, [rt.pools.by_name[name].view])
            before = policy.describe()  # type: ignore[attr-defined]
            await rt.reload(config_from_dict({"backends": entries[:1]}))
            return before, policy.describe()  # type: ignore[attr-defined]
        finally:
            await rt.stop()

    before, after = asyncio.run(scenario())
    assert before["backends"]["a"]["prefix_blocks"]["blocks"] > 0
    assert before["backends"]["b"]["prefix_blocks"]["blocks"] > 0
    assert (
        "prefix_blocks" not in after["backends"].get("b", {}) and after["backends"]["a"]["prefix_blocks"]["blocks"] > 0
    )


def _admin_state(url: str):
    with urllib.request.urlopen(f"{url}/admin/backends", timeout=10) as r:
        return decode_admin_backends(r.read())


def test_admin_add_drain_remove(tmp_path, twin_factory):
    a, b = twin_factory("k26-ar"), twin_factory("k26-dflash")
    with _gateway_over(tmp_path, a) as (url, _path, _port, _):
        # the typed shape loadgen and eval decode; `serving` needs a readiness check that has run
        assert wait_until(lambda: _admin_state(url).all_serving(with_server_info=True))
        state = _admin_state(url)
        assert [(x.name, x.up, x.circuit) for x in state.backends] == [("a", True, "closed")]
        assert state.backends[0].health_checks >= 1 and state.inflight == 0
        status, body = _post(f"{url}/admin/backends", _entry("b", b, "dflash"))
        assert status == 201 and body["name"] == "b" and body["strategy"] == "dflash"
        # the answer comes after its first poll: what the server says of itself is in it
        assert body["server_info"]["speculative_algorithm"] == "DFLASH" and body["cap"] > 0
        assert _post(f"{url}/admin/backends", _entry("b", b, "dflash"))[0] == 409
        status, body = _post(f"{url}/admin/backends", {"name": "c", "url": "ftp://x", "model": "m"})
        assert status == 400 and "url" in body["error"]["message"]
        status, _ = _post(f"{url}/v1/chat/completions", {"model": "kimi-k2.6@b", "messages": MSG, "max_tokens": 4})
        assert status == 200  # the added backend serves at once: the answer waited for its first check
        # one that does not answer is out of the pool from the start, not tried until checks fail
        dead = {"name": "dead", "url": f"http://127.0.0.1:{free_port()}", "model": "m3", "strategy": "ar"}
        status, body = _post(f"{url}/admin/backends", dead)
        assert status == 201 and body["up"] is False
        assert "m3" in _post(f"{url}/ready", method="GET")[1]["models_without_backend"]
        status, body = _post(f"{url}/v1/chat/completions", {"model": "m3", "messages": MSG, "max_tokens": 4})
        assert status == 503, body
        assert _post(f"{url}/admin/backends/dead", None, "DELETE")[0] == 200

        async def scenario() -> dict:
            stream = asyncio.create_task(_stream(url, "kimi-k2.6@b", 600))
            assert await asyncio.to_thread(wait_until, lambda: get_json(f"{url}/admin/backends")["inflight"] == 1)
            status, body = await asyncio.to_thread(_post, f"{url}/admin/backends/b", None, "DELETE")
            assert status == 200 and body["inflight_finishing"] == 1
            return await stream

        assert asyncio.run(scenario()) == {"done": True, "error": False, "tokens": 600}
        assert [x["name"] for x in get_json(f"{url}/admin/backends")["backends"]] == ["a"]
        # its series leave /metrics with it (names come and go: kept, they would grow without bound)
        assert wait_until(
            lambda: 'backend="b"' not in _metrics(url) and not get_json(f"{url}/admin/backends")["retiring"]
        )
        kept = 'backend="none",endpoint="chat",error_type="service_unavailable",model="m3",status="503"'
        assert f"specroute_requests_total{{{kept}}} 1.0" in _metrics(url)  # the rest stays
        status, body = _post(f"{url}/v1/chat/completions", {"model": "kimi-k2.6@b", "messages": MSG})
        assert status == 404
        assert _post(f"{url}/admin/backends/zzz", None, "DELETE")[0] == 404
        status, _ = _post(f"{url}/admin/backends/a/drain")
        assert status == 200
        state = _admin_state(url)
        assert state.backends[0].draining and not state.backends[0].up and not state.all_serving()


def test_sigterm_lets_streams_finish(tmp_path, twin_factory):
    a = twin_factory("k26-ar")
    with _gateway_over(tmp_path, a) as (url, _path, _port, proc):

        async def scenario() -> dict:
            stream = asyncio.create_task(_stream(url, "kimi-k2.6", 500))
            assert await asyncio.to_thread(wait_until, lambda: get_json(f"{url}/admin/backends")["inflight"] == 1)
            os.kill(proc.pid, signal.SIGTERM)
            return await stream

        assert asyncio.run(scenario()) == {"done": True, "error": False, "tokens": 500}
        # uvicorn re-raises the signal once it has shut down: the conventional "ended by SIGTERM"
        assert proc.wait(15) in (0, -signal.SIGTERM)


def test_sigterm_ends_what_outlives_the_grace_period_with_an_answer_and_aborts_upstream(tmp_path, twin_factory):
    """Past `shutdown_grace_s` the gateway ends what is still open itself: a started stream gets an
    error event and [DONE], a request waiting for its answer or for capacity a 503 with Retry-After,
    and the backend is left running nothing (uvicorn's own timeout would drop the connections)."""
    a = twin_factory("k26-ar")
    port = free_port()
    path = tmp_path / "g.toml"
    path.write_text(
        gateway_config(
            port,
            [_entry("a", a)],
            "[admission]\nmax_inflight = 2\nqueue_timeout_s = 600\n",
            gateway_keys="shutdown_grace_s = 0.5\n",
        )
    )
    url = f"http://127.0.0.1:{port}"

    def twin_busy() -> int:
        load = get_json(f"{a}/v1/loads")["loads"][0]
        return int(load["num_running_reqs"]) + int(load["num_waiting_reqs"])

    long = {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 40_000}  # minutes at the test time scale

    async def post(body: dict) -> tuple[int, dict[str, str], bytes]:
        async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/chat/completions", json=body) as r:
            return r.status, dict(r.headers), await r.read()

    with running(specroute("serve", "--config", str(path)), ready_url=f"{url}/health") as proc:

        async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
            tasks = [asyncio.create_task(post({**long, "stream": True})), asyncio.create_task(post(long))]
            assert await asyncio.to_thread(wait_until, lambda: get_json(f"{url}/admin/backends")["inflight"] == 2)
            tasks.append(asyncio.create_task(post(long)))
            assert await asyncio.to_thread(wait_until, lambda: get_json(f"{url}/admin/backends")["waiting"] == 1)
            os.kill(proc.pid, signal.SIGTERM)
            return await asyncio.gather(*tasks)

        (stream_status, _, stream), (status, headers, body), (queued_status, _, queued) = asyncio.run(scenario())
        assert proc.wait(30) in (0, -signal.SIGTERM)
        records = [json.loads(line) for line in output(proc).splitlines() if line.startswith('{"ts"')]
    events = [e[6:] for e in stream.decode().split("\n\n") if e.startswith("data: ")]
    assert stream_status == 200 and events[-1] == "[DONE]" and len(events) > 2, events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"], error
    assert status == 503 and headers["Retry-After"] == "1" and "shutting down" in json.loads(body)["error"]["message"]
    assert queued_status == 503 and "shutting down" in json.loads(queued)["error"]["message"]
    assert wait_until(lambda: twin_busy() == 0), "the backend kept generating for a gateway that had gone"
    cut = sorted(
        (r["stream"], r["status"], r.get("backend") or "") for r in records if r.get("error_type") == "gateway_shutdown"
    )
    assert cut == [(False, 503, ""), (False, 503, "a"), (True, 200, "a")], records


def test_reload_applies_health_admission_and_circuit_settings_to_running_backends(tmp_path, twin_factory):
    a = twin_factory("k26-ar")
    with _gateway_over(tmp_path, a) as (url, path, port, _):

        def cap():
            return get_json(f"{url}/admin/backends")["backends"][0]["cap"]

        # the twin's max_running_requests, once the poller has read /server_info (0 until then:
        # /health answers as soon as the process serves, before the first poll): an AR server's
        # request pool, max(min(KV tokens / context x 512, 4096), 2048) = 2048 in SGLang 0.5.23
        # (model_executor/pool_configurator.py; the k26-ar profile)
        assert wait_until(lambda: cap() == 2048)
        path.write_text(
            gateway_config(
                port, [_entry("a", a)], "[admission]\nbackend_max_inflight = 7\n[health]\ninterval_s = 0.05\n"
            )
        )
        status, body = _post(f"{url}/admin/reload")
        assert status == 200 and body == {"added": [], "removed": []}
        assert cap() == 7

        # readiness checks now every 50 ms instead of every second: 10 more take well under 5 s
        def checks():
            return get_json(f"{url}/admin/backends")["backends"][0]["health_checks"]

        start = checks()
        assert wait_until(lambda: checks() >= start + 10, timeout=5)


def test_reload_applies_the_tracing_sample_ratio(tmp_path, twin_factory):
    """Sampling raised at runtime: before the reload no request is traced (no trace-id header, which
    only a recorded trace gets), after it every one is."""
    a = twin_factory("k26-ar")
    body = {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 2}

    def traced(url: str) -> bool:
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=15) as r:
            return "x-specroute-trace-id" in r.headers

    tracing = '[tracing]\nexporter = "console"\nsample_ratio = {}\n'
    port = free_port()
    path = tmp_path / "g.toml"
    path.write_text(gateway_config(port, [_entry("a", a)], tracing.format(0.0)))
    url = f"http://127.0.0.1:{port}"
    with running(specroute("serve", "--config", str(path)), ready_url=f"{url}/health"):
        assert not any(traced(url) for _ in range(5))
        path.write_text(gateway_config(port, [_entry("a", a)], tracing.format(1.0)))
        assert _post(f"{url}/admin/reload")[0] == 200
        assert all(traced(url) for _ in range(5))


def test_reload_refuses_a_nan_health_interval_and_the_poller_keeps_running(tmp_path, twin_factory):
    """`interval_s = nan` used to be accepted on reload and the poller died on it. Refused now, by
    POST /admin/reload and by SIGHUP, and the readiness checks keep coming at the running interval."""
    a = twin_factory("k26-ar")
    with _gateway_over(tmp_path, a) as (url, path, port, proc):
        path.write_text(gateway_config(port, [_entry("a", a)], "[health]\ninterval_s = 0.05\n"))
        assert _post(f"{url}/admin/reload")[0] == 200

        def checks() -> int:
            return get_json(f"{url}/admin/backends")["backends"][0]["health_checks"]

        path.write_text(gateway_config(port, [_entry("a", a)], "[health]\ninterval_s = nan\n"))
        status, body = _post(f"{url}/admin/reload")
        assert status == 400 and "health.interval_s" in body["error"]["message"], body
        assert "finite" in body["error"]["message"]
        start = checks()
        assert wait_until(lambda: checks() >= start + 3)
        os.kill(proc.pid, signal.SIGHUP)
        assert wait_until(lambda: "SIGHUP reload" in output(proc) and "health.interval_s" in output(proc))
        start = checks()
        assert wait_until(lambda: checks() >= start + 3)
        assert [x["name"] for x in get_json(f"{url}/admin/backends")["backends"]] == ["a"]


def test_admin_changes_that_would_break_the_pool_are_refused_with_reasons(tmp_path, twin_factory):
    """A reload of a file with no backends (a half-written save), removing the backend a model is
    pinned to, a name that is not a string or has a '/': each refused by name, the pool untouched.
    A model whose only backend is removed and added back keeps its [models] section."""
    a, q = twin_factory("k26-ar"), twin_factory("k26-ar")
    port = free_port()
    path = tmp_path / "g.toml"
    backends = [_entry("a", a), _entry("a2", a), {"name": "q", "url": q, "model": "qwen", "strategy": "ar"}]
    sections = '[models."kimi-k2.6"]\npolicy = "pinned"\npinned_backend = "a"\n[models.qwen]\npolicy = "threshold"\n'
    path.write_text(gateway_config(port, backends, sections))
    url = f"http://127.0.0.1:{port}"
    with running(specroute("serve", "--config", str(path)), ready_url=f"{url}/health"):
        text = path.read_text()
        path.write_text(text.split("[[backends]]")[0])
        status, body = _post(f"{url}/admin/reload")
        assert status == 400 and "has no backends" in body["error"]["message"]
        path.write_text(text)
        status, body = _post(f"{url}/admin/backends/a", None, "DELETE")
        assert (
            status == 409 and body["error"]["code"] == "backend_in_use" and "pinned_backend" in body["error"]["message"]
        )
        status, body = _post(f"{url}/admin/backends", {"name": ["x"], "url": a, "model": "kimi-k2.6"})
        assert status == 400 and body["error"]["param"] == "name"
        status, body = _post(f"{url}/admin/backends", {"name": "a/b", "url": a, "model": "kimi-k2.6"})
        assert status == 400 and "without '@', '/' or '~'" in body["error"]["message"]
        assert [b["name"] for b in get_json(f"{url}/admin/backends")["backends"]] == ["a", "a2", "q"]
        assert _post(f"{url}/admin/backends/q", None, "DELETE")[0] == 200
        assert _post(f"{url}/admin/backends", {"name": "q", "url": q, "model": "qwen", "strategy": "ar"})[0] == 201
        assert get_json(f"{url}/admin/backends")["policies"]["qwen"]["name"] == "threshold"


def test_reload_applies_the_request_body_limit(tmp_path, twin_factory):
    with _gateway_over(tmp_path, twin_factory("k26-ar")) as (url, path, _port, _):
        body = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "x" * 4096}], "max_tokens": 2}
        assert _post(f"{url}/v1/chat/completions", body)[0] == 200
        path.write_text(path.read_text().replace("[gateway]\n", "[gateway]\nmax_body_bytes = 2048\n", 1))
        assert _post(f"{url}/admin/reload")[0] == 200
        status, error = _post(f"{url}/v1/chat/completions", body)
    assert status == 413 and "over 2048 bytes" in error["error"]["message"]
