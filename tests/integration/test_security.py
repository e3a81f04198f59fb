"""The attacks of issue 36, each against `specroute serve` and fake SGLang servers that log every
request they are sent (tests/fake_sglang.py): each is refused or harmless, and the backends saw
nothing but the gateway's own probes and what a well-formed request needs."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.response_ids import is_response_id
from tests.fake_sglang import PROBES
from tests.support import free_port, gateway, gateway_config, get_json, output, running, specroute, wait_until

CHAT = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class Fake:
    """A running fake SGLang server and its log of requests."""

    def __init__(self, url: str, log: Path, prefix: str = "") -> None:
        self.url, self.log, self.prefix = url, log, prefix

    def seen(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def from_gateway(self) -> list[dict]:
        """What a gateway sent it (not the tests' own readiness checks)."""
        return [r for r in self.seen() if r.get("via")]

    def beyond_probes(self) -> list[dict]:
        """What it was sent besides the gateway's probes of its readiness, load and identity."""
        return [r for r in self.seen() if r["path"].split("?")[0].removeprefix(self.prefix) not in PROBES]

    def entry(self, name: str, model: str = "kimi-k2.6") -> dict:
        return {"name": name, "url": self.url + self.prefix, "model": model, "strategy": "ar"}


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    with contextlib.ExitStack() as stack:

        def start(*args: str, prefix: str = "", model: str = "kimi-k2.6") -> Fake:
            port = free_port()
            log = tmp_path / f"fake-{port}.jsonl"
            cmd = [sys.executable, "-m", "tests.fake_sglang", "--port", str(port), "--log", str(log)]
            cmd += ["--prefix", prefix, "--model", model, *args]
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(running(cmd, ready_url=f"{url}{prefix}/ready"))
            return Fake(url, log, prefix)

        yield start


def call(
    url: str,
    method: str,
    path: str,
    body: object = None,
    key: str | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": content_type} if content_type else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except json.JSONDecodeError:
            return e.code, {"raw": raw.decode(errors="replace")}


# ---- ids are data, never paths ----------------------------------------------------------------------

TRAVERSALS = [
    "resp_a/../../../start_profile",
    "resp_c/../../../../escaped",
    "../../flush_cache",
    "resp_a%2F..%2F..%2Fstart_profile",
    "resp_\u2024\u2024/x",
    "resp_" + "a" * 200,
]


def test_a_response_id_never_reaches_a_backend_as_a_path(tmp_path, fakes):
    a = fakes(prefix="/prefix")
    b = fakes()
    other = fakes(model="qwen")
    backends = [a.entry("a"), b.entry("b"), other.entry("other", "qwen")]
    with gateway(tmp_path, backends) as url:
        for rid in TRAVERSALS:
            for model in ("no-such-model", "kimi-k2.6"):
                body = {"model": model, "input": "hi", "previous_response_id": rid}
                status, data = call(url, "POST", "/v1/responses", body)
                assert status == 400 and data["error"]["param"] == "previous_response_id", (rid, data)
                status, data = call(url, "POST", "/v1/responses", {"model": model, "input": "hi", "request_id": rid})
                assert status == 400 and data["error"]["param"] == "request_id"
            quoted = urllib.parse.quote(rid, safe="")
            assert call(url, "GET", f"/v1/responses/{quoted}")[0] in (400, 404)
            assert call(url, "POST", f"/v1/responses/{quoted}/cancel", {})[0] in (400, 404, 405)
            if rid.isascii():  # as a raw path too (urllib sends ASCII only)
                assert call(url, "GET", f"/v1/responses/{rid}")[0] in (400, 404)
        # a well-formed id of an unknown model: refused for its model before any backend is asked
        status, data = call(
            url, "POST", "/v1/responses", {"model": "no-such", "input": "hi", "previous_response_id": "resp_x1"}
        )
        assert status == 404 and data["error"]["code"] == "model_not_found"
        assert not a.beyond_probes() and not b.beyond_probes() and not other.beyond_probes()
        # and one of a served model: looked for among that model's backends only, at its own path
        call(url, "POST", "/v1/responses", {"model": "kimi-k2.6", "input": "hi", "previous_response_id": "resp_x2"})
    assert [r["path"] for r in a.beyond_probes() if r["method"] == "GET"] == ["/prefix/v1/responses/resp_x2"]
    assert [r["path"] for r in b.beyond_probes() if r["method"] == "GET"] == ["/v1/responses/resp_x2"]
    assert not other.beyond_probes()
    for fake in (a, b, other):
        for r in fake.seen():
            assert ".." not in r["path"] and "start_profile" not in r["path"] and "escaped" not in r["path"]


ids = st.text(max_size=40) | st.from_regex(r"resp_[A-Za-z0-9_./%-]{0,30}", fullmatch=True)


def test_fuzzed_ids_are_refused_or_looked_up_at_their_own_path(tmp_path, fakes):
    fake = fakes(prefix="/p")
    with gateway(tmp_path, [fake.entry("a")]) as url:
        tried: list[str] = []

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(ids)
        def one(rid: str) -> None:
            tried.append(rid)
            status, data = call(
                url, "POST", "/v1/responses", {"model": "kimi-k2.6", "input": "x", "previous_response_id": rid}
            )
            assert status != 500
            if not is_response_id(rid):
                assert status == 400 and data["error"]["param"] == "previous_response_id"
            status, _ = call(url, "GET", "/v1/responses/" + urllib.parse.quote(rid, safe=""))
            assert status < 500 or status == 503

        one()
    # a well-formed id: looked up at its own path, then the request itself is sent on. A path's
    # trailing slashes are the router's to drop (`resp_x/` is `resp_x`), so such an id is that one.
    routed = {rid.rstrip("/") for rid in tried}
    allowed = {f"/p/v1/responses/{rid}" for rid in routed if is_response_id(rid)} | {"/p/v1/responses"}
    for r in fake.beyond_probes():
        assert r["path"] in allowed, r


# ---- the admin API is the admin's alone ---------------------------------------------------------------


def test_an_api_key_is_no_admin_key_and_no_admin_key_closes_the_admin_api(tmp_path, fakes):
    good = fakes()
    evil = fakes()
    added = evil.entry("evil")
    with gateway(tmp_path, [good.entry("a")], '[auth]\napi_keys = ["tenant"]\n') as url:
        for key in ("tenant", None):
            status, data = call(url, "POST", "/admin/backends", added, key)
            assert status in (401, 403) and (status == 401 or "auth.admin_key" in data["error"]["message"])
            assert call(url, "GET", "/admin/backends", None, key)[0] in (401, 403)
            assert call(url, "POST", "/admin/backends/a/drain", {}, key)[0] in (401, 403)
            assert call(url, "POST", "/admin/reload", {}, key)[0] in (401, 403)
        assert call(url, "POST", "/v1/chat/completions", CHAT, "tenant")[0] == 200
    extra = '[auth]\napi_keys = ["tenant"]\nadmin_key = "root"\n'
    with gateway(tmp_path, [good.entry("a")], extra) as url:
        assert call(url, "POST", "/admin/backends", added, "tenant")[0] == 403
        assert call(url, "POST", "/admin/backends", added, "root")[0] == 201
    assert evil.from_gateway()  # added by the admin: polled


def test_a_post_that_is_not_json_changes_nothing(tmp_path, fakes):
    """A web page can send a text/plain POST to a gateway on the developer's machine with no CORS
    preflight: it must not add a backend, nor reach one."""
    good = fakes()
    evil = fakes()
    with gateway(tmp_path, [good.entry("a")]) as url:  # no keys, loopback: local development
        text = json.dumps(evil.entry("evil")).encode()
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
            status, data = call(url, "POST", "/admin/backends", text, content_type=content_type)
            assert status == 415 and data["error"]["param"] == "content-type"
            status, data = call(
                url, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), content_type=content_type
            )
            assert status == 415
        assert [b["name"] for b in get_json(f"{url}/admin/backends")["backends"]] == ["a"]
        # the developer's own JSON call still works: the local admin API is open
        assert call(url, "POST", "/admin/backends/a/drain", {})[0] == 200
    assert not good.beyond_probes() and not evil.from_gateway()


def test_a_reachable_listener_without_keys_is_refused_unless_said(tmp_path, fakes):
    fake = fakes()
    port = free_port()
    path = tmp_path / "open.toml"
    path.write_text(gateway_config(port, [fake.entry("a")]).replace("127.0.0.1", "0.0.0.0", 1))
    done = subprocess.run(specroute("serve", "--config", str(path)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "auth.allow_unauthenticated" in done.stderr
    path.write_text(path.read_text() + "[auth]\nallow_unauthenticated = true\n")
    with running(specroute("serve", "--config", str(path)), ready_url=f"http://127.0.0.1:{port}/health") as proc:
        url = f"http://127.0.0.1:{port}"
        assert call(url, "POST", "/v1/chat/completions", CHAT)[0] == 200
        status, data = call(url, "GET", "/admin/backends")
        assert status == 403 and "auth.admin_key" in data["error"]["message"]
        assert "UNAUTHENTICATED" in output(proc)


# ---- no client can take the pool down ------------------------------------------------------------------


def test_requests_that_make_backends_answer_500_cost_one_retry_and_no_circuit(tmp_path, fakes):
    """A prompt that makes SGLang fail (500) is that request's error: it is tried on one more backend
    and returned; the backends stay in the pool and ordinary requests are served."""
    a, b = fakes("--fail-on", "POISON"), fakes("--fail-on", "POISON")
    with gateway(tmp_path, [a.entry("a"), b.entry("b")], "[health]\ncircuit_failures = 2\n") as url:
        poison = {**CHAT, "messages": [{"role": "user", "content": "POISON please"}]}
        statuses = [call(url, "POST", "/v1/chat/completions", poison)[0] for _ in range(30)]
        ordinary = [call(url, "POST", "/v1/chat/completions", CHAT)[0] for _ in range(10)]
        state = get_json(f"{url}/admin/backends")
    assert statuses == [500] * 30 and ordinary == [200] * 10
    poisoned = sum(1 for f in (a, b) for r in f.seen() if r.get("poisoned"))
    assert poisoned == 60  # each poison request on two backends, never a third attempt
    assert {x["circuit"] for x in state["backends"]} == {"closed"}


def test_at_most_half_the_backends_are_ejected_and_a_lone_one_still_serves(tmp_path, twin_factory):
    bad = [twin_factory("k26-ar", "--fault-error-rate", "1.0", "--fault-error-status", "502") for _ in range(3)]
    good = twin_factory("k26-ar")
    backends = [{"name": f"bad{i}", "url": u, "model": "kimi-k2.6", "strategy": "ar"} for i, u in enumerate(bad)]
    backends.append({"name": "good", "url": good, "model": "kimi-k2.6", "strategy": "ar"})
    extra = "[health]\ncircuit_failures = 1\ncircuit_cooldown_s = 600\n"
    with gateway(tmp_path, backends, extra, gateway_keys='policy = "round_robin"\n') as url:
        for _ in range(40):
            call(url, "POST", "/v1/chat/completions", CHAT)
        state = get_json(f"{url}/admin/backends")
    ejected = [x["name"] for x in state["backends"] if x["circuit"] != "closed"]
    assert len(ejected) == 2  # 4 backends, at most half ejected
    # a model whose only backend failed: panic routing still sends it requests (its 502, not a 503)
    with gateway(tmp_path, backends[:1], "[health]\ncircuit_failures = 1\ncircuit_cooldown_s = 600\n") as url:
        first = [call(url, "POST", "/v1/chat/completions", CHAT)[0] for _ in range(3)]
        state = get_json(f"{url}/admin/backends")
    assert state["backends"][0]["circuit"] == "open" and first == [502, 502, 502]


def _raw_stream(port: int, body: dict) -> socket.socket:
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )
    return sock


def test_a_client_that_stops_reading_is_dropped_and_frees_its_backend(tmp_path, fakes):
    fake = fakes("--stream-chunk-bytes", "65536")
    with gateway(tmp_path, [fake.entry("a")], "[timeouts]\nclient_send_s = 1\n") as url:
        port = int(url.rsplit(":", 1)[1])
        sock = _raw_stream(port, {**CHAT, "stream": True})
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        stopped = time.monotonic()  # from here the client reads nothing
        assert wait_until(lambda: any(r.get("closed") for r in fake.seen()), timeout=60)
        upstream_closed = time.monotonic() - stopped
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0, timeout=30)
        # the client's connection is gone too: once what was in its buffers is read, the end
        sock.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(1 << 20):
                pass
        sock.close()
    print(
        f"\nstalled reader: upstream aborted {upstream_closed:.1f} s after the client stopped reading (client_send_s 1)"
    )


def test_a_slow_header_and_a_connection_over_the_cap_are_refused(tmp_path, fakes):
    fake = fakes()
    port = free_port()
    path = tmp_path / "limits.toml"
    path.write_text(
        gateway_config(port, [fake.entry("a")], "[timeouts]\nclient_header_s = 0.5\n", "max_connections = 3\n")
    )
    with running(specroute("serve", "--config", str(path)), ready_url=f"http://127.0.0.1:{port}/health"):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            answer = b""
            while chunk := slow.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"client_header_s" in answer
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as extra_one:
                refused = extra_one.recv(4096)
        finally:
            for s in idle:
                s.close()
        assert refused.startswith(b"HTTP/1.1 503") and b"max_connections" in refused


def test_bodies_being_read_are_bounded_in_bytes(tmp_path, fakes):
    """Two bodies of 0.6 MiB fit a 1 MiB budget one at a time: the second waits for the first; a
    chunked one that would overrun it is refused at once."""
    fake = fakes()
    port = free_port()
    path = tmp_path / "budget.toml"
    keys = "max_body_bytes = 700000\nmax_body_bytes_in_flight = 1048576\n"
    path.write_text(gateway_config(port, [fake.entry("a")], "", keys))
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 600_000}]}).encode()

    def head(length: str) -> bytes:
        return b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + length.encode()

    with running(specroute("serve", "--config", str(path)), ready_url=f"http://127.0.0.1:{port}/health"):
        first = socket.create_connection(("127.0.0.1", port), timeout=60)
        first.sendall(head(f"Content-Length: {len(big)}\r\n\r\n") + big[:1000])  # holds 0.6 MB of the budget
        time.sleep(0.2)
        second = socket.create_connection(("127.0.0.1", port), timeout=60)
        second.sendall(head(f"Content-Length: {len(big)}\r\n\r\n") + big)  # waits for room
        with socket.create_connection(("127.0.0.1", port), timeout=60) as chunked:
            chunk = big[:500_000]
            chunked.sendall(head("Transfer-Encoding: chunked\r\n\r\n") + b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            refused = b""
            while b"max_body_bytes_in_flight" not in refused and (part := chunked.recv(65536)):
                refused += part  # the head and the body may come in two reads
        assert refused.startswith(b"HTTP/1.1 503") and b"max_body_bytes_in_flight" in refused
        second.settimeout(0.5)
        with pytest.raises(TimeoutError):
            second.recv(1)  # still waiting behind the first
        first.sendall(big[1000:])
        for sock in (first, second):
            sock.settimeout(60)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.close()


def test_probes_have_their_own_connections(tmp_path, fakes):
    """With the traffic's pool full (one connection, held by a stream), the readiness checks still
    get through: the backend stays in the pool and its checks go on."""
    fake = fakes("--stream-chunk-bytes", "16")
    extra = "[health]\ninterval_s = 0.2\nunhealthy_after = 1\n"
    port = free_port()
    path = tmp_path / "pool.toml"
    path.write_text(gateway_config(port, [fake.entry("a")], extra, "upstream_connections = 1\n"))
    url = f"http://127.0.0.1:{port}"
    with running(specroute("serve", "--config", str(path)), ready_url=f"{url}/health"):
        sock = _raw_stream(port, {**CHAT, "stream": True})
        stop = threading.Event()

        def read() -> None:
            with contextlib.suppress(OSError):
                while not stop.is_set() and sock.recv(65536):
                    pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 1)
            before = get_json(f"{url}/admin/backends")["backends"][0]["health_checks"]
            assert wait_until(lambda: get_json(f"{url}/admin/backends")["backends"][0]["health_checks"] >= before + 5)
            state = get_json(f"{url}/admin/backends")["backends"][0]
        finally:
            stop.set()
            sock.close()
    assert state["ready"] and state["inflight"] == 1


# ---- what a client may ask of a shared fleet ----------------------------------------------------------


def test_guarded_extras_are_refused_unless_allowed(tmp_path, fakes):
    fake = fakes()
    with gateway(tmp_path, [fake.entry("a")]) as url:
        for field, value in [
            ("custom_logit_processor", "gASV..."),
            ("return_hidden_states", True),
            ("bootstrap_host", "10.0.0.1"),
            ("rid", "someone-elses"),
            ("data_parallel_rank", 0),
        ]:
            status, data = call(url, "POST", "/v1/chat/completions", {**CHAT, field: value})
            assert status == 400 and data["error"]["param"] == field and "allowed_extras" in data["error"]["message"]
        assert not fake.beyond_probes()
    with gateway(tmp_path, [fake.entry("a")], "", gateway_keys='allowed_extras = ["rid"]\n') as url:
        assert call(url, "POST", "/v1/chat/completions", {**CHAT, "rid": "mine"})[0] == 200
        assert call(url, "POST", "/v1/chat/completions", {**CHAT, "bootstrap_port": 1})[0] == 400


def test_priority_is_clamped_to_what_the_key_may_set(tmp_path, fakes):
    fake = fakes()
    extra = (
        '[auth]\napi_keys = ["plain"]\n[[auth.clients]]\nname = "batch"\nkey = "batch-key"\npriority_range = [-5, 10]\n'
    )
    with gateway(tmp_path, [fake.entry("a")], extra) as url:
        plain = call(url, "POST", "/v1/chat/completions", {**CHAT, "priority": 99}, "plain")[1]
        batch = call(url, "POST", "/v1/chat/completions", {**CHAT, "priority": 99}, "batch-key")[1]
        low = call(url, "POST", "/v1/chat/completions", {**CHAT, "priority": -99}, "batch-key")[1]
    assert (plain["priority_seen"], batch["priority_seen"], low["priority_seen"]) == (0, 10, -5)


def test_an_oversized_answer_and_an_oversized_name_are_cut(tmp_path, fakes):
    fake = fakes()
    with gateway(tmp_path, [fake.entry("a")], "", gateway_keys="max_response_bytes = 100\n") as url:
        status, data = call(url, "POST", "/v1/chat/completions", CHAT)
        assert status == 502 and "max_response_bytes" in data["error"]["message"]
        status, data = call(url, "POST", "/v1/chat/completions", {**CHAT, "model": "m" * 100_000})
    assert status == 404 and len(data["error"]["message"]) < 400


def test_a_request_that_timed_out_on_its_backend_is_not_run_again(tmp_path, twin_factory):
    """It ran there until the deadline: another backend would cost as long again, for the same work."""
    slow = [twin_factory("k26-ar", "--fault-latency-ms", "3000") for _ in range(2)]
    backends = [{"name": f"s{i}", "url": u, "model": "kimi-k2.6", "strategy": "ar"} for i, u in enumerate(slow)]
    with gateway(tmp_path, backends, "[timeouts]\nrequest_s = 0.5\nfirst_byte_s = 0.5\n") as url:
        for stream in (False, True):
            status, data = call(url, "POST", "/v1/chat/completions", {**CHAT, "stream": stream})
            message = data["error"]["message"]
            assert status == 504 and "within 0.5s" in message, data
        state = get_json(f"{url}/admin/backends")
    assert state["retries"] == 0
