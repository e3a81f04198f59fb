"""API keys: every route probed without a key, with a wrong one and with the right one."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.support import gateway

ROUTES = [  # (method, path, body)
    ("GET", "/v1/models", None),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("POST", "/v1/completions", {"model": "kimi-k2.6", "prompt": "hi", "max_tokens": 2}),
    ("GET", "/no/such/route", None),
]


def _call(url: str, method: str, path: str, body: dict | None, key: str | None) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(
        url + path, method=method, headers=headers, data=json.dumps(body).encode() if body is not None else None
    )
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


@pytest.fixture(scope="module")
def secured(tmp_path_factory, twin_factory):
    twin = twin_factory("k26-ar")
    extra = '[auth]\napi_keys = ["key-one"]\nadmin_key = "admin-secret"\nrate_limit_rps = 0.5\nrate_limit_burst = 30\n'
    backends = [{"name": "a", "url": twin, "model": "kimi-k2.6", "strategy": "ar"}]
    with gateway(tmp_path_factory.mktemp("auth"), backends, extra, env={"SPECROUTE_API_KEYS": "key-two"}) as url:
        yield url


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_routes_need_a_valid_key(secured, method, path, body):
    for key in (None, "wrong", "key-one-but-longer", "admin-secret"):
        status, data, _ = _call(secured, method, path, body, key)
        assert status == 401, (key, status)
        assert data["error"]["type"] == "authentication_error" and "key-one" not in json.dumps(data)
    status, _, _ = _call(secured, method, path, body, "key-one")
    assert status == (404 if path == "/no/such/route" else 200)
    status, _, _ = _call(secured, method, path, body, "key-two")  # from the environment
    assert status == (404 if path == "/no/such/route" else 200)


@pytest.mark.parametrize("path", ["/admin/backends", "//admin/backends", "/admin//backends/"])
def test_admin_routes_need_the_admin_key(secured, path):
    """However the path is spelt: the router routes `//admin/backends` to the admin API too."""
    assert _call(secured, "GET", path, None, None)[0] == 401
    assert _call(secured, "GET", path, None, "key-one")[0] == 403
    status, data, _ = _call(secured, "GET", path, None, "admin-secret")
    assert status == 200 and data["backends"][0]["name"] == "a"
    assert _call(secured, "POST", f"/{path}/a/drain", None, "key-one")[0] == 403
    assert not _call(secured, "GET", "/admin/backends", None, "admin-secret")[1]["backends"][0]["draining"]


def test_probes_stay_public(secured):
    assert _call(secured, "GET", "/health", None, None)[0] == 200
    assert _call(secured, "GET", "/ready", None, None)[0] == 200


def test_per_key_rate_limit(tmp_path, twin_factory):
    twin = twin_factory("k26-ar")
    backends = [{"name": "a", "url": twin, "model": "kimi-k2.6", "strategy": "ar"}]
    extra = '[auth]\napi_keys = ["k1", "k2"]\nadmin_key = "adm"\nrate_limit_rps = 0.1\nrate_limit_burst = 2\n'
    with gateway(tmp_path, backends, extra) as url:
        codes = [_call(url, "GET", "/v1/models", None, "k1")[0] for _ in range(3)]
        status, data, headers = _call(url, "GET", "/v1/models", None, "k1")
        other = _call(url, "GET", "/v1/models", None, "k2")[0]
        # a change of the pool makes a new config with the same [auth]: k1's bucket is not refilled
        added = {"name": "b", "url": twin, "model": "kimi-k2.6", "strategy": "ar"}
        assert _call(url, "POST", "/admin/backends", added, "k2")[0] == 403  # an API key is no admin key
        assert _call(url, "POST", "/admin/backends", added, "adm")[0] == 201
        after_change = _call(url, "GET", "/v1/models", None, "k1")[0]
    assert codes == [200, 200, 429] and status == 429 and after_change == 429
    assert data["error"]["type"] == "rate_limit_error" and int(headers["retry-after"]) >= 1
    assert other == 200  # buckets are per key
