"""A client that goes away leaves no work behind: real processes (`specroute sim`, `specroute serve`),
raw sockets that really close.

Three places a client can leave: while its request waits in the gateway's admission queue, while
the gateway waits for a non-streaming answer, and in the middle of a stream. In each, the twin
(which, like SGLang, aborts a request whose connection closes) must show nothing running within
`ABORT_DEADLINE_S`, polled, and the gateway nothing in flight or waiting. Every count is polled,
never read once: the gateway's engine checks put a 1-token request on the twin now and then.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import TEST_TIME_SCALE
from tests.support import get_json, one_slot_gateway, output

ABORT_DEADLINE_S = 0.5
MSG = [{"role": "user", "content": "Write a long history of the Roman republic."}]
# At the test time scale a token takes ~0.8 ms on the AR twin: 40k tokens outlive every step below.
LONG = 40_000


def _within(deadline_s: float, predicate: Callable[[], bool]) -> bool:
    """Poll `predicate` until true or `deadline_s` passes; the caller asserts the result."""
    end = time.monotonic() + deadline_s
    while True:
        if predicate():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.01)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[str, str, object]]:
    """A k26-ar twin behind a gateway that admits one request at a time (the next one queues)."""
    with one_slot_gateway(tmp_path_factory.mktemp("disconnect"), TEST_TIME_SCALE) as started:
        yield started


def _twin_busy(twin: str) -> int:
    load = get_json(f"{twin}/v1/loads")["loads"][0]
    return int(load["num_running_reqs"]) + int(load["num_waiting_reqs"])


def _gateway(url: str) -> dict:
    return get_json(f"{url}/admin/backends")


def _idle(url: str) -> bool:
    state = _gateway(url)
    return state["inflight"] == 0 and state["waiting"] == 0


@contextlib.contextmanager
def _request(url: str, body: dict) -> Iterator[socket.socket]:
    """POST `body` on a raw socket; leaving the block closes it, whatever the gateway has sent."""
    raw = json.dumps(body).encode()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
        )
        yield sock


def _read_events(sock: socket.socket, n: int) -> bytes:
    received = b""
    while received.count(b"data: ") < n:
        part = sock.recv(65536)
        assert part, f"the stream ended early: {received[-500:]!r}"
        received += part
    return received


def _records(proc: object) -> list[dict]:
    return [json.loads(line) for line in output(proc).splitlines() if line.startswith('{"ts"')]  # type: ignore[arg-type]


def _settled(twin: str, url: str) -> None:
    assert _within(10, lambda: _twin_busy(twin) == 0 and _idle(url)), "the previous test left work behind"


def test_disconnect_during_a_non_stream_upstream_wait_aborts_the_backend_request(setup):
    twin, url, proc = setup
    _settled(twin, url)
    with _request(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": LONG}):
        assert _within(10, lambda: _twin_busy(twin) == 1 and _gateway(url)["inflight"] == 1)
    # the socket is closed: the gateway must close its upstream connection at once
    assert _within(ABORT_DEADLINE_S, lambda: _twin_busy(twin) == 0), "the twin kept generating for nobody"
    assert _within(ABORT_DEADLINE_S, lambda: _idle(url))
    assert _within(
        5, lambda: any(r.get("error_type") == "client_disconnected" and not r["stream"] for r in _records(proc))
    )
    rec = next(r for r in reversed(_records(proc)) if r.get("error_type") == "client_disconnected")
    assert rec["status"] == 499 and rec["backend"] == "ar" and rec.get("completion_tokens", 0) == 0, json.dumps(rec)


def test_disconnect_mid_stream_aborts_the_backend_request(setup):
    twin, url, proc = setup
    _settled(twin, url)
    with _request(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": LONG, "stream": True}) as sock:
        _read_events(sock, 5)
        assert _within(10, lambda: _twin_busy(twin) == 1 and _gateway(url)["inflight"] == 1)
    assert _within(ABORT_DEADLINE_S, lambda: _twin_busy(twin) == 0), "the twin kept generating for nobody"
    assert _within(ABORT_DEADLINE_S, lambda: _idle(url))
    assert _within(5, lambda: any(r.get("error_type") == "client_disconnected" and r["stream"] for r in _records(proc)))
    rec = next(r for r in reversed(_records(proc)) if r.get("error_type") == "client_disconnected" and r["stream"])
    assert rec["status"] == 200 and rec["backend"] == "ar" and rec["ttft_s"] > 0  # the stream had started


def test_disconnect_while_queued_is_never_dispatched(setup):
    twin, url, proc = setup
    _settled(twin, url)

    def decisions():
        return sum(v for k, v in _metrics(url).items() if k.startswith("specroute_policy_decisions_total"))

    before = decisions()
    # The holder takes the only slot and keeps it past everything the waiter does.
    with _request(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": LONG, "stream": True}) as holder:
        _read_events(holder, 3)
        with _request(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 8}):
            assert _within(10, lambda: _gateway(url)["waiting"] == 1)
        assert _within(ABORT_DEADLINE_S, lambda: _gateway(url)["waiting"] == 0), "the waiter stayed queued"
        # still holding: the waiter's place was given up, not passed a slot
        assert _within(10, lambda: _twin_busy(twin) == 1 and _gateway(url)["inflight"] == 1)
        _read_events(holder, 3)  # and still streaming
    assert _within(ABORT_DEADLINE_S, lambda: _twin_busy(twin) == 0), "the twin kept generating for nobody"
    assert _within(ABORT_DEADLINE_S, lambda: _idle(url))
    assert decisions() == before + 1  # only the holder was ever routed

    # its record: never dispatched (no backend), it waited, and it says why it ended
    def waiter():
        return next(
            (
                r
                for r in _records(proc)
                if r.get("error_type") == "client_disconnected" and not r["stream"] and "backend" not in r
            ),
            None,
        )

    assert _within(5, lambda: waiter() is not None)
    assert waiter()["status"] == 499 and waiter()["queue_s"] > 0


def _metrics(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
