"""Every fault knob of the twin, on a real process."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.integration.test_sim_server import CHAT, get, post
from tests.support import free_port, running, specroute
from twin.faults import CRASH_EXIT_CODE


def _cmd(port: int, profile: str, *extra: str) -> list[str]:
    return specroute("sim", "--profile", profile, "--port", str(port), "--time-scale", "0.02", *extra)


def _chat_stream(
    port: int, max_tokens: int, timeout: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed chat request on its own connection, its response's head read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps({**CHAT, "max_tokens": max_tokens, "stream": True}),
        headers={"Content-Type": "application/json"},
    )
    return conn, conn.getresponse()


def _wait(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_added_latency_delays_the_response():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "zero", "--fault-latency-ms", "400"), ready_url=f"{url}/ready"):
        t0 = time.monotonic()
        status, body = post(f"{url}/v1/chat/completions", {**CHAT, "max_tokens": 2})
        assert status == 200 and body["usage"]["completion_tokens"] == 2
        assert time.monotonic() - t0 >= 0.4


def test_error_rate_answers_5xx_before_first_byte():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "zero", "--fault-error-rate", "1"), ready_url=f"{url}/ready"):
        status, err = post(f"{url}/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 500 and err["object"] == "error" and err["code"] == 500
        status, err = post(f"{url}/generate", {"text": "x"})
        assert status == 500 and isinstance(err["error"], str)
        assert get(f"{url}/v1/models")[0] == 200  # only generation is affected


def test_error_rate_fraction_is_partial_and_seeded():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "zero", "--fault-error-rate", "0.5", "--seed", "3"), ready_url=f"{url}/ready"):
        codes = [post(f"{url}/v1/completions", {"prompt": "x", "max_tokens": 1})[0] for _ in range(40)]
    assert set(codes) == {200, 500}


def test_crash_after_tokens_exits_the_process():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "k26-ar", "--fault-crash-after-tokens", "20"), ready_url=f"{url}/ready") as proc:
        with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
            post(f"{url}/v1/chat/completions", {**CHAT, "max_tokens": 200})
        assert proc.wait(15) == CRASH_EXIT_CODE


def test_hang_after_tokens_stops_progress():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "zero", "--fault-hang-after-tokens", "5"), ready_url=f"{url}/ready") as proc:
        conn, resp = _chat_stream(port, 1000, timeout=1)
        assert resp.status == 200
        # a zero-cost server would finish 1000 tokens in milliseconds; hung, it never does
        with pytest.raises((socket.timeout, TimeoutError)):
            while resp.readline():
                pass
        conn.close()
        assert proc.poll() is None  # hung, not dead
        # as SGLang's: /ready knows nothing of it until a health check has seen no step finish for its
        # whole timeout (20 s, scaled to 0.4 s here, floored at 2 s of wall-clock); then both answer 503
        assert get(f"{url}/ready")[0] == 200
        assert _status(f"{url}/health_generate") == 503
        assert _status(f"{url}/ready") == 503


def test_health_passes_during_a_prefill_longer_than_its_timeout():
    """SGLang answers a health check after every batch, prefill chunks included: a prompt whose
    prefill outlasts the check's timeout (2 s here) does not make the server look hung."""
    import threading

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute("sim", "--profile", "k26-ar", "--port", str(port), "--time-scale", "0.1")
    with running(cmd, ready_url=f"{url}/ready"):
        done = threading.Event()
        long = {"model": "kimi-k2.6", "prompt": "word " * 100_000, "max_tokens": 1}  # ~60 s of prefill, 6 s here
        worker = threading.Thread(target=lambda: (post(f"{url}/v1/completions", long), done.set()), daemon=True)
        worker.start()
        _wait(lambda: get(f"{url}/v1/loads")[1]["loads"][0]["num_running_reqs"] == 1)
        assert _status(f"{url}/health_generate") == 200
        assert not done.is_set(), "the prefill ended before the check: it proved nothing"
        assert _status(f"{url}/ready") == 200
        worker.join(60)


def test_health_passes_on_an_idle_and_on_a_busy_server():
    """The check passes on a step the engine finishes after it began: its own 1-token request when
    idle; when busy it is not queued at all, and the running request's next step answers it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "k26-ar", "--max-running-requests", "1"), ready_url=f"{url}/ready"):
        assert _status(f"{url}/health") == 200 and _status(f"{url}/health_generate") == 200
        conn, resp = _chat_stream(port, 20_000, timeout=30)
        assert resp.status == 200  # running, and holding the only slot
        assert _status(f"{url}/health") == 200 and _status(f"{url}/ready") == 200
        conn.close()


def test_slow_ready_answers_503_then_200():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_cmd(port, "zero", "--fault-slow-ready", "2"), ready_url=None):
        _wait(lambda: _status(f"{url}/v1/models") == 200)  # listening
        assert _status(f"{url}/ready") == 503
        assert _status(f"{url}/health") == 503
        assert post(f"{url}/v1/chat/completions", CHAT)[0] == 503
        _wait(lambda: _status(f"{url}/ready") == 200)
        assert post(f"{url}/v1/chat/completions", {**CHAT, "max_tokens": 2})[0] == 200


def test_acceptance_drops_after_given_time():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    body = {**CHAT, "max_tokens": 200, "return_spec_tokens_details": True}

    def accept_length() -> float:
        return post(f"{url}/v1/chat/completions", body)[1]["sglext"]["spec_tokens_details"]["spec_accept_length"]

    with running(
        _cmd(port, "k26-dflash", "--fault-accept-drop-at", "1.0", "--fault-accept-drop-to", "0.1"),
        ready_url=f"{url}/ready",
    ):
        assert accept_length() > 3
        _wait(lambda: accept_length() < 1.5)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return -1
