"""CORS, off unless configured: a browser's preflight is answered before the API-key gate (it
carries no key), a real request from an allowed origin gets the headers a browser needs to read
the answer, and an origin not listed gets none. Real HTTP against the gateway over a twin."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from gateway.access_log import AccessLog
from gateway.config import Config, config_from_dict
from tests.inprocess import serve_in_thread

APP = "https://app.example"
BODY = json.dumps({"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def _call(
    url: str, method: str, path: str, headers: dict[str, str], body: str | None = None
) -> tuple[int, dict, bytes]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def _preflight(url: str, origin: str) -> tuple[int, dict, bytes]:
    return _call(
        url,
        "OPTIONS",
        "/v1/chat/completions",
        {
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )


def _config(twin: str, origins: list[str]) -> Config:
    return config_from_dict(
        {
            "gateway": {"cors_allow_origins": origins},
            "auth": {"api_keys": ["sk-test"]},
            "backends": [{"name": "d", "url": twin, "model": "kimi-k2.6", "strategy": "dflash"}],
        }
    )


def test_an_allowed_origin_gets_its_preflight_and_readable_answers():
    """No backend needed: the preflight, the gate's refusal and a litestar route."""
    with serve_in_thread(_config("http://127.0.0.1:9", [APP]), access_log=AccessLog(False)) as gw:
        status, headers, _ = _preflight(gw, APP)
        # answered without a key, before the gate, naming what the browser asked for; litestar's CORS
        # answers 204 No Content (the Fetch standard's CORS check takes any 2xx)
        assert status == 204, headers
        assert headers["access-control-allow-origin"] == APP
        assert "POST" in headers["access-control-allow-methods"]
        assert "authorization" in headers["access-control-allow-headers"].lower()
        status, headers, body = _call(gw, "POST", "/v1/chat/completions", {"Origin": APP}, BODY)
        assert status == 401 and headers["access-control-allow-origin"] == APP and "error" in json.loads(body)
        key = {"Authorization": "Bearer sk-test"}
        status, headers, _ = _call(gw, "GET", "/v1/models", {"Origin": APP, **key})
        assert status == 200 and headers["access-control-allow-origin"] == APP
        exposed = headers["access-control-expose-headers"].lower()
        assert "x-specroute-backend" in exposed and "x-request-id" in exposed

        # another origin: its preflight is refused, and nothing lets a browser read an answer
        status, headers, _ = _preflight(gw, "https://evil.example")
        assert status == 400 and "access-control-allow-origin" not in headers
        status, headers, _ = _call(gw, "GET", "/v1/models", {"Origin": "https://evil.example", **key})
        assert status == 200 and "access-control-allow-origin" not in headers


def test_generated_answers_streamed_or_not_carry_the_headers(twin_factory):
    twin = twin_factory("k26-dflash")
    with serve_in_thread(_config(twin, [APP]), access_log=AccessLog(False)) as gw:
        auth = {"Origin": APP, "Authorization": "Bearer sk-test", "Content-Type": "application/json"}
        status, headers, body = _call(gw, "POST", "/v1/chat/completions", auth, BODY)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        assert headers["access-control-allow-origin"] == APP and headers["x-specroute-backend"] == "d"
        streamed = json.dumps({**json.loads(BODY), "stream": True})
        status, headers, body = _call(gw, "POST", "/v1/chat/completions", auth, streamed)
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]")
        assert headers["access-control-allow-origin"] == APP


def test_without_origins_configured_there_are_no_cors_headers():
    with serve_in_thread(_config("http://127.0.0.1:9", []), access_log=AccessLog(False)) as gw:
        status, headers, _ = _preflight(gw, APP)
        assert status == 401 and "access-control-allow-origin" not in headers  # the gate: no key
        status, headers, _ = _call(gw, "GET", "/v1/models", {"Origin": APP, "Authorization": "Bearer sk-test"})
        assert status == 200 and "access-control-allow-origin" not in headers
