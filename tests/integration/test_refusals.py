"""Refusals at the door (gateway/refusals.py): the key gate's 401/403/415/429, the connection cap's
503 and the header deadline's 408 reach `specroute_http_refused_total{reason,status}` and the access
log (`"event": "refused"`), against a running `specroute serve`."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from tests.support import free_port, output, running, specroute, wait_until


def _call(url: str, headers: dict[str, str], data: bytes | None = b"{}") -> int:
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _refused(text: str) -> dict[tuple[str, str], float]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {(s.labels["reason"], s.labels["status"]): s.value for s in families["specroute_http_refused"].samples}


def test_refusals_at_the_door_are_counted_by_reason_and_logged(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{port}"\nmax_connections = 3\n'
        "[timeouts]\nclient_header_s = 2.0\n"
        '[auth]\napi_keys = ["sk-good"]\nadmin_key = "admin-key"\nrate_limit_rps = 0.001\nrate_limit_burst = 1\n'
        "[[backends]]\n"
        f'name = "a"\nurl = "http://127.0.0.1:{free_port()}"\nmodel = "m"\n'
    )
    chat = f"{base}/v1/chat/completions"
    json_type = {"Content-Type": "application/json"}
    with running(specroute("serve", "--config", str(config)), ready_url=f"{base}/health") as proc:
        assert set(_refused(_scrape(base)).values()) == {0.0}  # every series there from the start
        assert _call(chat, json_type) == 401  # no key
        assert _call(chat, {**json_type, "Authorization": "Bearer sk-bad"}) == 401
        assert _call(f"{base}/admin/backends", {"Authorization": "Bearer sk-good"}, None) == 403
        # the key's one token goes to a request refused for its media type, the next finds none
        assert _call(chat, {"Content-Type": "text/plain", "Authorization": "Bearer sk-good"}) == 415
        assert _call(chat, {**json_type, "Authorization": "Bearer sk-good"}) == 429
        # three connections that send nothing fill max_connections: a fourth is turned away at once;
        # the three get 408 once client_header_s has passed
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            assert _fourth(port).startswith(b"HTTP/1.1 503")
            answers = [_until_closed(s) for s in idle]
        finally:
            for s in idle:
                s.close()
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
        refused = _refused(_scrape(base))
        assert wait_until(lambda: len(_logged(output(proc))) >= 8)
        logged = _logged(output(proc))
    assert {k: v for k, v in refused.items() if v} == {
        ("missing_key", "401"): 1,
        ("invalid_key", "401"): 1,
        ("invalid_admin_key", "403"): 1,
        ("unsupported_media_type", "415"): 1,
        ("rate_limited", "429"): 1,
        ("connection_limit", "503"): 1,
        ("header_timeout", "408"): 3,
    }
    assert Counter((line["reason"], str(line["status"])) for line in logged) == Counter(
        {k: int(v) for k, v in refused.items() if v}
    )
    by_reason = {line["reason"]: line for line in logged}
    assert by_reason["invalid_key"]["path"] == "/v1/chat/completions" and by_reason["invalid_key"]["method"] == "POST"
    assert all(line["client"] == "127.0.0.1" for line in logged)
    assert "sk-bad" not in output(proc)  # keys are never logged, refused ones neither


def _scrape(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        return r.read().decode()


def _fourth(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        return _until_closed(s)


def _until_closed(s: socket.socket) -> bytes:
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    return answer


def _logged(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"ts"') and '"event":"refused"' in line]
