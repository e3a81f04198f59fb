"""A backend URL that leads back to the gateway: the request is refused (508) at the hop that
forwarded it before, not forwarded round and round (gateway.via)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import openai
import pytest

from gateway.access_log import AccessLog
from gateway.config import config_from_dict
from gateway.via import VIA_ENTRY, forwarded_via, has_looped
from tests.inprocess import serve_in_thread
from tests.support import free_port, gateway_config, get_json, running, specroute, wait_until

MODEL = "kimi-k2.6"


def _request(url: str, body: dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _raw_post(base_url: str, path: str, body: dict, headers: list[tuple[str, str]]) -> int:
    """A POST with `headers` sent as given, repeated names on lines of their own."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", path)
    raw = json.dumps(body).encode()
    for name, value in [("Content-Type", "application/json"), ("Content-Length", str(len(raw))), *headers]:
        conn.putheader(name, value)
    conn.endheaders(raw)
    status = conn.getresponse().status
    conn.close()
    return status


def _requests_recorded(base_url: str) -> float:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("specroute_requests_total{"))


def test_via_keeps_what_came_in_and_names_this_gateway_last():
    assert forwarded_via(None) == VIA_ENTRY
    assert forwarded_via("1.1 lb") == f"1.1 lb, {VIA_ENTRY}"
    assert has_looped(forwarded_via("1.0 proxy"))
    assert not has_looped("1.1 lb, 1.1 specroute-000000000000") and not has_looped(None)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_names_this_gateway_in_its_via_is_refused_on_every_route(twin_factory, stream):
    url = twin_factory("k26-dflash")
    config = config_from_dict({"backends": [{"name": "d", "url": url, "model": MODEL, "strategy": "dflash"}]})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    looped = {"Via": f"1.1 lb, {VIA_ENTRY}"}
    with serve_in_thread(config, access_log=AccessLog(False)) as gw:
        status, answer = _request(f"{gw}/v1/chat/completions", body, looped)
        assert status == 508 and answer["error"]["code"] == "loop_detected"
        assert "Via" in answer["error"]["message"]
        assert _request(f"{gw}/ready", headers=looped)[0] == 508
        # the entry on a second Via line counts as well (a list header may come on several lines)
        two_lines = _raw_post(gw, "/v1/chat/completions", body, [("Via", "1.0 a"), ("Via", VIA_ENTRY)])
        assert two_lines == 508
        assert _request(f"{gw}/v1/responses/resp_abc", headers=looped)[0] == 508
        # another gateway's entry is no loop: the request is served
        other = {"Via": "1.1 specroute-0123456789ab"}
        status, answer = _request(f"{gw}/v1/chat/completions", {**body, "stream": False}, other)
        assert status == 200 and answer["usage"]["completion_tokens"] == 4


def test_a_backend_whose_url_is_this_gateway_leaves_the_pool_and_costs_no_request(tmp_path, twin_factory):
    twin = twin_factory("k26-dflash")
    port = free_port()
    own = f"http://127.0.0.1:{port}"
    backends = [
        {"name": "real", "url": twin, "model": MODEL, "strategy": "dflash"},
        {"name": "self", "url": own, "model": MODEL, "strategy": "dflash"},
    ]
    config = tmp_path / "gateway.toml"
    config.write_text(gateway_config(port, backends))
    with running(specroute("serve", "--config", str(config)), ready_url=f"{own}/health"):
        client = openai.OpenAI(base_url=f"{own}/v1", api_key="x", max_retries=0)
        served = []
        for _ in range(6):  # some may go out before the first readiness check has found the loop
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Tell me about Rome."}], max_tokens=4
            )
            served.append(raw.headers["x-specroute-backend"])
            assert raw.parse().usage.completion_tokens == 4
        assert served == ["real"] * 6

        def looped() -> bool:
            state = {b["name"]: b for b in get_json(f"{own}/admin/backends")["backends"]}
            return state["self"]["loop_detected"] is True and not state["self"]["ready"]

        assert wait_until(looped)
        assert get_json(f"{own}/admin/backends")["inflight"] == 0


def test_two_gateways_that_are_each_others_backend_answer_a_request_once_each(tmp_path):
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    # readiness checks that never take a backend out: each gateway's /ready depends on the other's
    # backends, so without this the pair would go unready, and the request never be forwarded
    health = "[health]\nunhealthy_after = 1000000\n[retry]\nattempts = 1\n"
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(gateway_config(port_a, [{"name": "b", "url": url_b, "model": MODEL, "strategy": "ar"}], health))
    b.write_text(gateway_config(port_b, [{"name": "a", "url": url_a, "model": MODEL, "strategy": "ar"}], health))
    with (
        running(specroute("serve", "--config", str(a)), ready_url=f"{url_a}/health"),
        running(specroute("serve", "--config", str(b)), ready_url=f"{url_b}/health"),
    ):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        status, answer = _request(f"{url_a}/v1/chat/completions", body)
        assert status == 502
        assert "forwards back to this gateway" in answer["error"]["message"]
        # A answered the client and refused the request when it came back; B forwarded it once
        assert _requests_recorded(url_a) == 2
        assert _requests_recorded(url_b) == 1


def test_a_loop_through_a_working_path_costs_neither_gateway_its_requests(tmp_path, twin_factory):
    """`outer`'s backends: `inner` (another gateway, whose only backend is `outer`) and a twin.
    A request `outer` sends to `inner` comes back to `outer` (508 naming `outer`): `outer` tries
    the twin. One a client sends to `inner` reaches `outer`, which may send it back to `inner`:
    that 508 names `inner`, so `outer` takes it as no fault of its backend and tries the twin."""
    twin = twin_factory("k26-dflash")
    port_o, port_i = free_port(), free_port()
    url_o, url_i = f"http://127.0.0.1:{port_o}", f"http://127.0.0.1:{port_i}"
    round_robin = '[models."kimi-k2.6"]\npolicy = "round_robin"\n'
    outer, inner = tmp_path / "outer.toml", tmp_path / "inner.toml"
    outer.write_text(
        gateway_config(
            port_o,
            [
                {"name": "inner", "url": url_i, "model": MODEL, "strategy": "dflash"},
                {"name": "twin", "url": twin, "model": MODEL, "strategy": "dflash"},
            ],
            round_robin,
        )
    )
    inner.write_text(gateway_config(port_i, [{"name": "outer", "url": url_o, "model": MODEL, "strategy": "dflash"}]))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with (
        running(specroute("serve", "--config", str(inner)), ready_url=f"{url_i}/health"),
        running(specroute("serve", "--config", str(outer)), ready_url=f"{url_o}/health"),
    ):
        assert wait_until(lambda: _request(f"{url_i}/ready")[0] == 200)  # `inner` has seen `outer` up
        for url in [url_o, url_i] * 4:
            status, answer = _request(f"{url}/v1/chat/completions", body)
            assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer
        # the loops cost nobody's circuit but the one whose backend leads back: `inner`'s stays closed
        (to_outer,) = get_json(f"{url_i}/admin/backends")["backends"]
        assert to_outer["circuit"] == "closed" and to_outer["up"]
        assert get_json(f"{url_o}/admin/backends")["inflight"] == 0
