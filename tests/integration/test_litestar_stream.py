"""The generation routes under a root_path (which litestar's router strips before it routes them to
their ASGI handlers): streams complete, and a client disconnect still aborts upstream."""

from __future__ import annotations

import json
import urllib.request

import pytest

from gateway.access_log import AccessLog
from gateway.config import config_from_dict
from tests.inprocess import serve_in_thread
from tests.support import get_json, open_stream, wait_until

MSG = [{"role": "user", "content": "Natalia sold clips to 48 friends and then half as many. How many in total?"}]


@pytest.fixture(scope="module")
def litestar_gateway(twin_factory):
    """The gateway in-process behind a root_path."""
    backend = twin_factory("k26-ar")
    config = config_from_dict({"backends": [{"name": "a", "url": backend, "model": "kimi-k2.6", "strategy": "ar"}]})
    with serve_in_thread(config, root_path="/api", access_log=AccessLog(False)) as url:
        yield url, backend


def test_stream_through_litestar_is_complete(litestar_gateway):
    url, _ = litestar_gateway
    body = {
        "model": "kimi-k2.6",
        "messages": MSG,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = [e for e in r.read().decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 12
    assert not any('"error"' in e for e in events)
    assert get_json(f"{url}/admin/backends")["inflight"] == 0


def test_client_disconnect_through_litestar_aborts_the_upstream_request(litestar_gateway):
    url, backend = litestar_gateway

    def running() -> int:
        return get_json(f"{backend}/v1/loads")["loads"][0]["num_running_reqs"]

    with open_stream(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 5000, "stream": True}):
        assert wait_until(lambda: running() == 1)
    assert wait_until(lambda: running() == 0)
    assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0)
