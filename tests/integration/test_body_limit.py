"""A body over `gateway.max_body_bytes` gets an OpenAI-shaped 413 naming the limit, announced or not,
and costs the backend nothing."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.request
from urllib.parse import urlsplit

import openai
import pytest

from gateway.access_log import AccessLog
from gateway.config import config_from_dict
from tests.inprocess import serve_in_thread

LIMIT = 4096


def _post(url: str, body: bytes, chunked: bool) -> tuple[int, dict]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if chunked:  # no Content-Length: the limit must hold while the body arrives
        conn.request("POST", "/v1/chat/completions", body=iter([body[:1000], body[1000:]]), headers=headers)
    else:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_a_413_naming_it(twin_factory, chunked):
    url = twin_factory("k26-dflash", "--enable-metrics")
    config = config_from_dict(
        {
            "gateway": {"max_body_bytes": LIMIT},
            "backends": [{"name": "d", "url": url, "model": "kimi-k2.6", "strategy": "dflash"}],
        }
    )
    big = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "x" * 2 * LIMIT}], "max_tokens": 4}
    with serve_in_thread(config, access_log=AccessLog(False)) as gw:
        status, body = _post(gw, json.dumps(big).encode(), chunked)
        assert status == 413
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert f"over {LIMIT} bytes" in body["error"]["message"] and "max_body_bytes" in body["error"]["message"]
        # a body under the limit still goes through
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        small = client.chat.completions.create(
            model="kimi-k2.6", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert small.usage.completion_tokens == 4
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    (served,) = [line for line in metrics.splitlines() if line.startswith("sglang:num_requests_total")]
    assert float(served.split()[-1]) == 1  # the small one only: the big body never reached the backend


def test_requests_refused_at_the_door_are_counted_like_any_other(twin_factory):
    """A body over the limit, a bad Host header and a GET on a generation route are answered before
    the request is read, and still get their record: /metrics counts them by status."""
    url = twin_factory("k26-dflash")
    config = config_from_dict(
        {
            "gateway": {"max_body_bytes": LIMIT},
            "backends": [{"name": "d", "url": url, "model": "kimi-k2.6", "strategy": "dflash"}],
        }
    )
    big = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "x" * 2 * LIMIT}]}
    with serve_in_thread(config, access_log=AccessLog(False)) as gw:
        assert _post(gw, json.dumps(big).encode(), chunked=False)[0] == 413
        assert _post(gw, json.dumps(big).encode(), chunked=True)[0] == 413
        u = urlsplit(gw)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", "/v1/chat/completions")
        wrong_method = conn.getresponse()
        wrong_method.read()
        conn.request(
            "POST", "/v1/chat/completions", body=b"{}", headers={"Host": "bad host", "Content-Type": "application/json"}
        )
        bad_host = conn.getresponse()
        bad_host.read()
        conn.close()
        with urllib.request.urlopen(f"{gw}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    assert wrong_method.status == 405 and wrong_method.getheader("Allow") == "POST"
    assert bad_host.status == 400
    counted = {
        line.split('status="')[1].split('"')[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("specroute_requests_total{")
    }
    assert counted == {"413": 2.0, "405": 1.0, "400": 1.0}
    # ...and among the refusals at the door, by reason
    for reason, status, count in (("body_too_large", 413, 2), ("method_not_allowed", 405, 1), ("bad_request", 400, 1)):
        assert f'specroute_http_refused_total{{reason="{reason}",status="{status}"}} {count:.1f}' in metrics


def test_a_body_that_trickles_in_is_cut_after_client_body_s(twin_factory):
    """A client that announces a body and then sends it a byte at a time, or not at all, holds a
    connection and a buffer: after timeouts.client_body_s it gets a 408 and the connection closes."""
    url = twin_factory("k26-dflash")
    config = config_from_dict(
        {
            "timeouts": {"client_body_s": 0.5},
            "backends": [{"name": "d", "url": url, "model": "kimi-k2.6", "strategy": "dflash"}],
        }
    )
    with serve_in_thread(config, access_log=AccessLog(False)) as gw:
        u = urlsplit(gw)
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"model"'
            )
            answer = b""
            while chunk := s.recv(65536):  # until the gateway closes the connection
                answer += chunk
        with urllib.request.urlopen(f"{gw}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert "not received within 0.5s" in error["message"] and "client_body_s" in error["message"]
    request = 'backend="none",endpoint="chat",error_type="timeout_error",model="unknown",status="408"'
    assert f"specroute_requests_total{{{request}}} 1.0" in metrics
    assert 'specroute_http_refused_total{reason="body_timeout",status="408"} 1.0' in metrics
