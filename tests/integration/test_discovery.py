"""Backends that follow a DNS name (gateway/discovery.py), against a real DNS server on loopback:
Debian's dnsmasq serving a hosts file that the test rewrites (SIGHUP makes dnsmasq read it again),
twins on 127.0.0.2 and 127.0.0.3 (the same port: a name's addresses share the entry's port), and
`specroute serve` asking that server (`discovery.nameservers`), so the machine's resolver is never
touched. Skips, with the reason, where dnsmasq is not installed (.ci/run installs dnsmasq-base)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import TEST_TIME_SCALE
from tests.support import free_port, get_json, output, running, specroute, wait_until

DNSMASQ = shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq",) if Path(p).exists()), None)
pytestmark = pytest.mark.skipif(DNSMASQ is None, reason="dnsmasq is not installed (apt-get install dnsmasq-base)")

NAME = "sglang-k26.specroute.test"
MSG = [{"role": "user", "content": "Count to ten."}]


def _chat(url: str, model: str, max_tokens: int = 8) -> tuple[int, dict]:
    body = json.dumps({"model": model, "messages": MSG, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _stream(url: str, model: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": MSG, "max_tokens": max_tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        events = [e[6:] for e in r.read().decode().split("\n\n") if e.startswith("data: ")]
    parsed = [json.loads(e) for e in events if e != "[DONE]"]
    return {
        "done": events[-1] == "[DONE]",
        "error": any("error" in p for p in parsed),
        "tokens": next((p["usage"]["completion_tokens"] for p in parsed if p.get("usage")), 0),
        "finish": next(
            (c["finish_reason"] for p in parsed for c in p.get("choices", []) if c.get("finish_reason")), None
        ),
    }


class Dns:
    """dnsmasq on 127.0.0.1:`port`, answering for *.specroute.test from a hosts file alone."""

    def __init__(self, root: Path) -> None:
        self.hosts = root / "hosts"
        self.hosts.write_text("")
        self.port = free_port()
        self.cmd = [
            str(DNSMASQ),
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            f"--addn-hosts={self.hosts}",
            "--local=/specroute.test/",  # names of the zone not in the file: NXDOMAIN, not forwarded
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            f"--port={self.port}",
            "--local-ttl=0",
            f"--pid-file={root / 'dnsmasq.pid'}",
            f"--user={'root' if os.geteuid() == 0 else getpass.getuser()}",  # not its own user: none here
            "--log-facility=-",
        ]
        self.proc = None

    def serve(self, *addresses: str) -> None:
        self.hosts.write_text("".join(f"{a} {NAME}\n" for a in addresses))
        self.proc.send_signal(signal.SIGHUP)


@pytest.fixture
def dns(tmp_path):
    server = Dns(tmp_path)
    with running(server.cmd) as proc:
        server.proc = proc
        assert wait_until(lambda: "started, version" in output(proc), timeout=10), output(proc)
        yield server


def _admin(url: str, method: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _inflight(url: str, name: str) -> int:
    return next((b["inflight"] for b in get_json(f"{url}/admin/backends")["backends"] if b["name"] == name), 0)


def _members(url: str) -> dict[str, bool]:
    return {b["name"]: b["up"] for b in get_json(f"{url}/admin/backends")["backends"]}


def test_backends_follow_a_dns_name_and_the_one_that_leaves_loses_no_request(tmp_path, dns):
    port = free_port("127.0.0.2")
    twins = {
        address: running(
            specroute(
                "sim", "--profile", "k26-ar", "--host", address, "--port", str(port), "--time-scale", TEST_TIME_SCALE
            ),
            ready_url=f"http://{address}:{port}/ready",
            timeout=60,
        )
        for address in ("127.0.0.2", "127.0.0.3")
    }
    gw_port = free_port()
    url = f"http://127.0.0.1:{gw_port}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{gw_port}"\n'
        "[health]\ninterval_s = 0.25\n"
        f'[discovery]\nresolve_s = 0.5\nnameservers = ["127.0.0.1:{dns.port}"]\n'
        f'[[backends]]\nname = "k26"\nurl = "http://{NAME}:{port}"\nmodel = "kimi-k2.6"\ndiscover = "dns"\n'
    )
    dns.serve("127.0.0.2")
    with (
        twins["127.0.0.2"],
        twins["127.0.0.3"],
        running(specroute("serve", "--config", str(config)), ready_url=f"{url}/health") as gw,
    ):
        assert wait_until(lambda: _members(url) == {"k26~127.0.0.2": True})
        assert _chat(url, "kimi-k2.6")[0] == 200
        # a member is the name's, not the admin API's: removing it is refused (it would be back at the
        # next lookup), and a discovered entry comes from the file
        status, body = _admin(f"{url}/admin/backends/k26~127.0.0.2", "DELETE")
        assert status == 409 and "discover" in body["error"]["message"], body
        entry = {"name": "k27", "url": f"http://{NAME}:{port}", "model": "kimi-k2.6", "discover": "dns"}
        status, body = _admin(f"{url}/admin/backends", "POST", entry)
        assert status == 400 and "config file" in body["error"]["message"], body

        # an address appears: it joins once its first readiness check passed
        started = time.monotonic()
        dns.serve("127.0.0.2", "127.0.0.3")
        assert wait_until(lambda: _members(url) == {"k26~127.0.0.2": True, "k26~127.0.0.3": True}, timeout=30)
        print(f"\naddress added -> member up: {time.monotonic() - started:.2f} s (resolve_s 0.5)")

        # a stream on the one that will leave, and requests all along while it leaves
        results: dict[str, object] = {}
        statuses: list[int] = []
        stop = threading.Event()

        def stream() -> None:
            results["stream"] = _stream(url, "kimi-k2.6@k26~127.0.0.3", 6000)  # some seconds at this time scale

        def traffic() -> None:
            while not stop.is_set():
                statuses.append(_chat(url, "kimi-k2.6")[0])

        threads = [threading.Thread(target=stream), threading.Thread(target=traffic)]
        for t in threads:
            t.start()
        assert wait_until(lambda: _inflight(url, "k26~127.0.0.3") == 1)
        started = time.monotonic()
        dns.serve("127.0.0.2")
        assert wait_until(lambda: "k26~127.0.0.3" not in _members(url), timeout=30)
        print(f"address removed -> member out of the pool: {time.monotonic() - started:.2f} s")
        retiring = {b["name"]: b["inflight"] for b in get_json(f"{url}/admin/backends")["retiring"]}
        threads[0].join(120)
        stop.set()
        threads[1].join(60)
        assert retiring == {"k26~127.0.0.3": 1}  # out of the pool, its stream still running
        finished = results["stream"]
        assert finished["done"] and not finished["error"] and finished["finish"] in ("stop", "length"), finished
        assert finished["tokens"] > 0  # it drained to its end, not cut
        assert statuses and set(statuses) == {200}, statuses  # no request lost while it left
        assert wait_until(lambda: not get_json(f"{url}/admin/backends")["retiring"])

        # the name has no address any more: the entry stays, with no members; the model answers 503
        dns.serve()
        assert wait_until(lambda: _members(url) == {}, timeout=30)
        status, body = _chat(url, "kimi-k2.6")
        assert status == 503, body
        message = body["error"]["message"]
        assert NAME in message and "resolves to no address" in message and "'k26'" in message
        assert "kimi-k2.6" in {m["id"] for m in get_json(f"{url}/v1/models")["data"]}
        assert f"DNS name {NAME} resolves to no address" in output(gw)

        # ...and back: the model answers again
        dns.serve("127.0.0.3")
        assert wait_until(lambda: _members(url) == {"k26~127.0.0.3": True}, timeout=30)
        assert _chat(url, "kimi-k2.6")[0] == 200
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'specroute_discovered_backends{entry="k26"} 1.0' in metrics
        assert 'specroute_discovery_lookup_failures_total{entry="k26"} 0.0' in metrics

        # the DNS server gone: no answer is not an empty answer, the members stay
        dns.proc.terminate()
        assert wait_until(lambda: "could not be resolved" in output(gw), timeout=30)
        assert _members(url) == {"k26~127.0.0.3": True} and _chat(url, "kimi-k2.6")[0] == 200
