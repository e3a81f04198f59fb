"""The gateway's own cost, measured against going direct to the backend, in one run on loopback.

    python -m bench.gateway_bench [--quick] [--repeats 3] [--output bench/results.json]

Processes (pinned when the machine has two CPUs or more):

- the zero-delay backend (`bench.zero_server`: raw asyncio + httptools, canned SGLang answers,
  also the OTLP/HTTP sink for the tracing-on gateway) on CPU 0;
- this process, the load generator (`bench.client`: raw asyncio + httptools) on CPU 0;
- three gateways, `specroute serve --config FILE` over that backend, on CPU 1: tracing off
  (`off`), tracing on with every request traced (`on`: OTEL_EXPORTER_OTLP_ENDPOINT at the sink),
  and tracing on with `tracing.sample_ratio = 0.1` (`on10`, throughput scenarios only). All run the
  real hot path: an API key, the goodput policy, Prometheus metrics and the JSON access log (to a
  file). A tracing gateway's span exporter process (`gateway.span_export`: OTLP encoding and export)
  is moved to CPU 0 with the sink, as a collector-side process; its own CPU per request (over the
  whole run) and the spans dropped are reported next to the gateway's figures;
- the stack's floor (`bench.bare_relay`: the same uvicorn + aiohttp relaying with no gateway logic)
  on CPU 1, in `ns_max` and `st_c32`: its CPU per request and per chunk, and the gateway's over it
  per repeat, say how much of the gateway's cost is its own and how much the stack's;
- SGLang's Rust router (`sglang-router`, from its own venv: `--rust-router`, made by `make bench`)
  on CPU 1 over the same backend, in the zero-delay scenarios: the reference for what a router in
  front of SGLang costs.

Two clients, both on CPU 0: the raw one (`bench.client`: asyncio + httptools, a few microseconds per
request, so its figures are the servers' cost) and an ordinary one (`bench.ordinary_client`:
aiohttp, as users' clients are). The ordinary client costs ~100 us per request itself, which
cancels out of an added latency only if the answers reach it the same way; the raw client counts
the socket reads each answer took (`*_reads_per_response`), which is where they differ.

Every scenario runs direct and through each gateway, interleaved, `--repeats` times; the figures
are the medians over the repeats of per-repeat differences (added latency) or per-repeat ratios and
per-request costs, so they hold on a noisy machine. Gateway CPU is utime + stime of the whole
gateway process (all threads) from /proc/PID/stat, over the run, divided by the requests (or
relayed chunks) the client received.

Scenarios:

- `ns_c1`: non-streaming, one client, zero-delay backend: added latency p50/p99.
- `ns_c32`: non-streaming, 32 clients, the backend holds each answer 0-40 ms (spread evenly, mean
  20 ms: a service time, so 32 are in flight without saturating anything and latency measures the
  gateway, not a queue).
- `ns_max`: non-streaming, 64 clients, zero-delay backend: the gateway saturates its CPU; max
  requests/s and CPU per request.
- `st_c1`: streaming (64 chunks), one client, zero-delay: added TTFT p50/p99.
- `st_c32`: streaming, 32 clients, first token held 0-40 ms then a chunk every 2 ms (16k chunks/s
  offered, each chunk its own read at the gateway, as real token streams arrive): added TTFT and
  CPU per relayed chunk.
- `st_max`: streaming, 32 clients, zero-delay: max relayed chunks/s (chunks batch up per read).
- `ns_c1_http`, `ns_c32_http`, `st_c1_http`: by the ordinary client, zero-delay: added p50 at C=1
  (target: no more than the Rust router's), C=32 requests/s against direct (target >= 0.9x), added
  TTFT at C=1.
- `ns_pairs` (tracing cost): `ns_max` in short slices, off / on / on10 alternating per round, with
  three processes of each mode (one process of the same code runs up to ~3% faster or slower than
  another); per round, the mean over a mode's processes.
- routing: `bench.choose.bench_choose("goodput")` with 4 and 16 backends, microseconds per decision.
- memory: gateway RSS idle, after the measured runs ("warm"), and after 100,000 requests in all
  (flat within 10% of warm).

The figures are compared with the previous results file (`--output`, before it is overwritten):
`vs_last_run` in the JSON and a line under the table list those that moved by more than 5%.

Not a test: `tests/integration/test_bench.py` runs `--quick` and checks the schema only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import ordinary_client
from bench.client import LevelResult, closed_loop, request_bytes
from bench.routers.peers import sglang_cmd
from common.percentile import percentile
from tools.processes import free_port, spawn, stop, wait_ready

REPO = Path(__file__).resolve().parent.parent
API_KEY = "bench-key-0123456789"
ADMIN_KEY = "bench-admin-0123456789"
CHUNKS = 64
_TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------- processes


@contextlib.contextmanager
def _process(
    cmd: list[str],
    log: Path,
    cpu: int | None,
    env: dict[str, str] | None = None,
    ready_url: str | None = None,
    ready_timeout_s: float = 60.0,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen]:
    log.unlink(missing_ok=True)
    proc = spawn(cmd, log_file=log, env={**os.environ, **(env or {})}, cwd=cwd or REPO, cpu=cpu)
    try:
        if ready_url:
            wait_ready(ready_url, proc=proc, timeout_s=ready_timeout_s, name=cmd[0], log_file=log)
        yield proc
    finally:
        stop(proc, 15)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def child_pids(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _gateway_toml(port: int, backend_port: int) -> str:
    return f"""[gateway]
listen = "127.0.0.1:{port}"
policy = "goodput"

[auth]
api_keys = ["{API_KEY}"]
admin_key = "{ADMIN_KEY}"

[[backends]]
name = "zero"
url = "http://127.0.0.1:{backend_port}"
model = "bench-model"
strategy = "ar"
"""


def gateway_command(config: Path, server: str) -> list[str]:
    """How a gateway is started: the product's own `specroute serve`, or (for the ASGI server
    comparison) the same app under another server."""
    if server == "default":
        return [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    return [sys.executable, "-m", "bench.asgi_servers", server, str(config)]


# ---------------------------------------------------------------------------------------- workload


def _body(stream: bool, hold_ms: float = 0, interval_ms: float = 0) -> bytes:
    body: dict[str, Any] = {
        "model": "bench-model",
        "max_tokens": CHUNKS,
        "stream": stream,
        "messages": [{"role": "user", "content": "Explain the difference between a list and a tuple in Python."}],
    }
    if hold_ms:
        body["bench_hold_ms"] = hold_ms
    if interval_ms:
        body["bench_interval_ms"] = interval_ms
    return json.dumps(body, separators=(",", ":")).encode()


class Target:
    def __init__(self, name: str, port: int, pid: int | None, only: tuple[str, ...] | None = None) -> None:
        self.name, self.port, self.pid = name, port, pid
        self.only = only  # the scenarios it takes part in (None: all)
        self.requests = 0  # received by this target over the whole run
        self.exporter_pid: int | None = None  # a tracing gateway's span exporter process
        self.proc: subprocess.Popen | None = None  # checked alive at the end, when set

    def raw(self, body: bytes) -> bytes:
        return request_bytes(
            "/v1/chat/completions", body, f"127.0.0.1:{self.port}", [("authorization", f"Bearer {API_KEY}")]
        )


def admin_state(target: Target) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{target.port}/admin/backends", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _ms(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100, `common.percentile`) of samples in seconds, in ms; NaN for none."""
    value = percentile(samples, q)
    return float("nan") if value is None else value * 1e3


async def run_level(
    target: Target,
    body: bytes,
    concurrency: int,
    *,
    requests: int | None = None,
    duration: float | None = None,
    client: str = "raw",
) -> dict[str, Any]:
    """One closed-loop level against `target` by the raw client or the ordinary one ("http": aiohttp)."""
    cpu0 = cpu_seconds(target.pid) if target.pid else 0.0
    res: LevelResult
    if client == "http":
        res = await ordinary_client.closed_loop(
            f"http://127.0.0.1:{target.port}/v1/chat/completions",
            body,
            {"authorization": f"Bearer {API_KEY}"},
            concurrency,
            requests=requests,
            duration=duration,
        )
    else:
        res = await closed_loop(
            "127.0.0.1", target.port, target.raw(body), concurrency, requests=requests, duration=duration
        )
    cpu = (cpu_seconds(target.pid) - cpu0) if target.pid else None
    target.requests += res.count + res.errors
    out = {
        "n": res.count,
        "errors": res.errors,
        "wall_s": res.wall,
        "rps": res.count / res.wall,
        "chunks": res.chunks,
        "chunks_per_s": res.chunks / res.wall,
        "lat_p50_ms": _ms(res.latencies, 50),
        "lat_p99_ms": _ms(res.latencies, 99),
        "ttft_p50_ms": _ms(res.ttfts, 50),
        "ttft_p99_ms": _ms(res.ttfts, 99),
        "reads_per_response": res.reads / max(1, res.count),
    }
    if cpu is not None:
        out["cpu_s"] = cpu
        out["cpu_us_per_request"] = cpu / max(1, res.count) * 1e6
        out["cpu_us_per_chunk"] = cpu / max(1, res.chunks) * 1e6
        out["cpu_busy"] = cpu / res.wall
    return out


class Plan:
    def __init__(
        self,
        quick: bool,
        repeats: int,
        scenarios: list[str] | None = None,
        memory_requests: int | None = None,
        duration: float | None = None,
    ) -> None:
        self.repeats = 1 if quick else repeats
        self.scenarios = scenarios or list(SCENARIOS)
        self.c1_requests = 60 if quick else 1500
        self.c1_stream_requests = 30 if quick else 300
        self.duration = 0.4 if quick else 3.0
        self.warmup = 200 if quick else 2000
        self.memory_requests = 3000 if quick else 100_000
        if memory_requests is not None:
            self.memory_requests = memory_requests
        if duration is not None:
            self.duration = duration
        self.policy_iterations = 1000 if quick else 20000
        # tracing cost: paired short slices, so slow drift of a shared machine hits off and on alike
        self.tracing_rounds = 2 if quick else 10
        self.tracing_slice_s = 0.3 if quick else 1.0
        # Processes per tracing mode in those slices: one process of the same code runs up to ~3%
        # faster or slower than another (memory layout), more than the effect being measured.
        self.tracing_processes = 1 if quick else 3


SCENARIOS: dict[str, dict[str, Any]] = {
    "ns_c1": {"stream": False, "concurrency": 1, "kind": "requests"},
    "ns_c32": {"stream": False, "concurrency": 32, "hold_ms": 20, "kind": "duration"},
    "ns_max": {"stream": False, "concurrency": 64, "kind": "duration"},
    "st_c1": {"stream": True, "concurrency": 1, "kind": "requests"},
    "st_c32": {"stream": True, "concurrency": 32, "hold_ms": 20, "interval_ms": 2, "kind": "duration"},
    "st_max": {"stream": True, "concurrency": 32, "kind": "duration"},
    # The same requests by the ordinary client (aiohttp), zero-delay: what a user's client sees.
    "ns_c1_http": {"stream": False, "concurrency": 1, "kind": "requests", "client": "http"},
    "ns_c32_http": {"stream": False, "concurrency": 32, "kind": "duration", "client": "http"},
    "st_c1_http": {"stream": True, "concurrency": 1, "kind": "requests", "client": "http"},
}
RAW_SCENARIOS = tuple(n for n, sc in SCENARIOS.items() if sc.get("client", "raw") == "raw")
# SGLang's Rust router: the zero-delay scenarios, by both clients. Not the paced ones (ns_c32, st_c32):
# it re-encodes the request body with the fields it knows, so the backend never sees the pacing fields.
ROUTER_SCENARIOS = ("ns_c1", "ns_max", "st_c1", "st_max", "ns_c1_http", "ns_c32_http", "st_c1_http")


async def quiesce(previous: Target | None, limit_s: float = 10.0) -> None:
    """After a tracing gateway's level, wait until its span exporter process has worked off that
    level's spans (its CPU time flat for 0.1 s; at most `limit_s`), so that work does not land on
    the next level's CPU 0."""
    pid = previous.exporter_pid if previous is not None else None
    if not pid:
        return
    deadline = time.monotonic() + limit_s
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = cpu_seconds(pid)
        if now - last < 0.005:
            return
        last = now


async def measure(targets: list[Target], plan: Plan, log: Callable[[str], None]) -> dict[str, Any]:
    """runs[scenario][target] = [level result per repeat]"""
    runs: dict[str, dict[str, list[dict]]] = {
        s: {t.name: [] for t in targets if t.only is None or s in t.only} for s in SCENARIOS
    }
    for t in targets:  # warm-up: connection pools, policy estimates, code paths
        await run_level(t, _body(False), 8, requests=plan.warmup)
        await run_level(t, _body(True), 8, requests=plan.warmup // 10)
    previous: Target | None = None
    for rep in range(plan.repeats):
        for name, sc in SCENARIOS.items():
            if name not in plan.scenarios:
                continue
            body = _body(sc["stream"], sc.get("hold_ms", 0), sc.get("interval_ms", 0))
            order = targets if rep % 2 == 0 else targets[::-1]  # alternate, so drift hits all alike
            for t in order:
                if t.only is not None and name not in t.only:
                    continue
                await quiesce(previous)
                previous = t
                client = sc.get("client", "raw")
                if sc["kind"] == "requests":
                    n = plan.c1_stream_requests if sc["stream"] else plan.c1_requests
                    r = await run_level(t, body, sc["concurrency"], requests=n, client=client)
                else:
                    r = await run_level(t, body, sc["concurrency"], duration=plan.duration, client=client)
                runs[name][t.name].append(r)
            log(
                f"  repeat {rep + 1}/{plan.repeats} {name:11s} "
                + "  ".join(
                    f"{t.name}: {runs[name][t.name][-1]['rps']:7.0f} req/s" for t in targets if t.name in runs[name]
                )
            )
    return runs


async def measure_tracing(gateways: list[Target], plan: Plan, log: Callable[[str], None]) -> dict[str, list[dict]]:
    """Saturated non-streaming throughput of the tracing-off and tracing-on gateways in paired
    short slices (order alternating per round): runs["ns_pairs"][mode] = [slice per round], each
    slice the mean over that mode's processes."""
    out: dict[str, list[dict]] = {t.name: [] for t in gateways}
    body = _body(False)
    previous: Target | None = None
    for rnd in range(plan.tracing_rounds):
        for t in gateways if rnd % 2 == 0 else gateways[::-1]:
            await quiesce(previous)
            previous = t
            out[t.name].append(await run_level(t, body, 64, duration=plan.tracing_slice_s))
    pooled = _pool_replicas(out)
    log(
        "  tracing pairs: "
        + "  ".join(f"{n}: {_median([r['rps'] for r in rs]):7.0f} req/s" for n, rs in pooled.items())
    )
    return pooled


def _pool_replicas(out: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Per round, the mean over a mode's processes (`gw_on`, `gw_on~2`, ...) of each figure."""
    modes: dict[str, list[list[dict]]] = {}
    for name, slices in out.items():
        modes.setdefault(name.partition("~")[0], []).append(slices)
    return {
        mode: [
            {k: statistics.fmean(s[k] for s in per_round) for k in ("rps", "cpu_us_per_request")}
            for per_round in zip(*instances, strict=False)
        ]
        for mode, instances in modes.items()
    }


# ---------------------------------------------------------------------------------------- figures


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def _added(runs: dict, scenario: str, gw: str, field: str) -> float:
    """Median over repeats of (through the gateway - direct)."""
    pairs = zip(runs[scenario].get(gw, []), runs[scenario]["direct"], strict=False)
    return _median([g[field] - d[field] for g, d in pairs])


def _gw(runs: dict, scenario: str, gw: str, field: str) -> float:
    return _median([g[field] for g in runs[scenario].get(gw, [])])


def _cost(runs: dict, scenario: str, gw: str, field: str) -> float:
    """Median over repeats of the throughput lost against the tracing-off gateway, in %."""
    pairs = runs.get(scenario, {})
    both = zip(pairs.get(gw, []), pairs.get("gw_off", []), strict=False)
    return _median([(1 - on[field] / off[field]) * 100 for on, off in both])


def _ratio(runs: dict, scenario: str, a: str, b: str, field: str) -> float:
    """Median over repeats of a / b (same repeat, so drift hits both alike)."""
    pairs = runs.get(scenario, {})
    return _median([x[field] / y[field] for x, y in zip(pairs.get(a, []), pairs.get(b, []), strict=False) if y[field]])


def figures(
    runs: dict,
    routing: dict[int, float],
    memory: dict[str, float],
    gateways: list[str],
    spans_dropped: dict[str, int],
    exporter_cpu: dict[str, float],
) -> list[dict]:
    out: list[dict] = []

    def add(
        name: str, tracing: str | None, value: float, unit: str, target: float | None = None, better: str = "lower"
    ) -> None:
        if value != value:  # a scenario left out (--scenarios)
            return
        status = "info"
        if target is not None:
            ok = value <= target if better == "lower" else value >= target
            status = "PASS" if ok else "MISS"
        out.append(
            {
                "name": name,
                "tracing": tracing,
                "value": value,
                "unit": unit,
                "target": target,
                "better": better,
                "status": status,
            }
        )

    for gw in gateways:
        tr = gw.split("_")[1]
        add("ns_c1_added_p50", tr, _added(runs, "ns_c1", gw, "lat_p50_ms"), "ms", 0.5)
        add("ns_c1_added_p99", tr, _added(runs, "ns_c1", gw, "lat_p99_ms"), "ms")
        add("ns_c32_added_p50", tr, _added(runs, "ns_c32", gw, "lat_p50_ms"), "ms")
        add("ns_c32_added_p99", tr, _added(runs, "ns_c32", gw, "lat_p99_ms"), "ms", 2.0)
        add("ns_max_rps", tr, _gw(runs, "ns_max", gw, "rps"), "req/s", better="higher")
        add("ns_cpu_per_request", tr, _gw(runs, "ns_max", gw, "cpu_us_per_request"), "us", 250)
        add("ns_c1_cpu_per_request", tr, _gw(runs, "ns_c1", gw, "cpu_us_per_request"), "us")
        add("st_c1_added_ttft_p50", tr, _added(runs, "st_c1", gw, "ttft_p50_ms"), "ms", 0.5)
        add("st_c1_added_ttft_p99", tr, _added(runs, "st_c1", gw, "ttft_p99_ms"), "ms")
        add("st_c32_added_ttft_p50", tr, _added(runs, "st_c32", gw, "ttft_p50_ms"), "ms")
        add("st_c32_added_ttft_p99", tr, _added(runs, "st_c32", gw, "ttft_p99_ms"), "ms")
        add("st_cpu_per_chunk", tr, _gw(runs, "st_c32", gw, "cpu_us_per_chunk"), "us", 15)
        add("st_max_chunks_per_s", tr, _gw(runs, "st_max", gw, "chunks_per_s"), "chunks/s", better="higher")
        add("st_max_cpu_per_chunk", tr, _gw(runs, "st_max", gw, "cpu_us_per_chunk"), "us")
    for gw in gateways:
        if gw.startswith("gw_on"):
            tr = gw.split("_")[1]
            add("tracing_throughput_cost", tr, _cost(runs, "ns_pairs", gw, "rps"), "%", 5.0)
            add("tracing_throughput_cost_repeats", tr, _cost(runs, "ns_max", gw, "rps"), "%")
            add(
                "tracing_cpu_per_request",
                tr,
                _median(
                    [
                        on["cpu_us_per_request"] - off["cpu_us_per_request"]
                        for on, off in zip(
                            runs.get("ns_pairs", {}).get(gw, []),
                            runs.get("ns_pairs", {}).get("gw_off", []),
                            strict=False,
                        )
                    ]
                ),
                "us",
            )
            add("tracing_stream_throughput_cost", tr, _cost(runs, "st_max", gw, "chunks_per_s"), "%")
            add("exporter_cpu_per_request", tr, exporter_cpu.get(gw, float("nan")), "us")
            add("spans_dropped", tr, spans_dropped.get(gw, 0), "spans", 0)
    add("direct_max_rps", None, _gw(runs, "ns_max", "direct", "rps"), "req/s", better="higher")
    # The stack's floor: what uvicorn + aiohttp cost relaying the same traffic with no gateway logic,
    # and the tracing-off gateway per repeat against it.
    add("bare_cpu_per_request", None, _gw(runs, "ns_max", "bare", "cpu_us_per_request"), "us")
    add("bare_cpu_per_chunk", None, _gw(runs, "st_c32", "bare", "cpu_us_per_chunk"), "us")
    add("st_cpu_per_chunk_over_bare", "off", _ratio(runs, "st_c32", "gw_off", "bare", "cpu_us_per_chunk"), "x")
    add("ns_cpu_per_request_over_bare", "off", _ratio(runs, "ns_max", "gw_off", "bare", "cpu_us_per_request"), "x")
    for n, us in sorted(routing.items()):
        add(f"routing_goodput_{n}_backends", None, us, "us", 20.0 if n == 16 else None)
    add("rss_idle", "off", memory["idle_mib"], "MiB")
    add("rss_warm", "off", memory["warm_mib"], "MiB")
    add("rss_after_requests", "off", memory["after_mib"], "MiB")
    add("rss_growth_after_warm", "off", (memory["after_mib"] / memory["warm_mib"] - 1) * 100, "%", 10.0)
    _client_figures(runs, add)
    return out


def _client_figures(runs: dict, add: Callable[..., None]) -> None:
    """The ordinary client's figures and SGLang's Rust router beside the gateway (tracing off). The
    targets: added p50 at C=1 no more than the router's, C=32 throughput at least 0.9x direct, both
    by the ordinary client."""
    router = bool(runs.get("ns_c1", {}).get("router"))
    nan = float("nan")
    router_c1 = _added(runs, "ns_c1_http", "router", "lat_p50_ms") if router else nan
    add(
        "ns_c1_added_p50_http",
        "off",
        _added(runs, "ns_c1_http", "gw_off", "lat_p50_ms"),
        "ms",
        router_c1 if router_c1 == router_c1 else None,
    )
    add("ns_c32_vs_direct_http", "off", _ratio(runs, "ns_c32_http", "gw_off", "direct", "rps"), "x", 0.9, "higher")
    add("st_c1_added_ttft_p50_http", "off", _added(runs, "st_c1_http", "gw_off", "ttft_p50_ms"), "ms")
    # What the ordinary client adds to the raw client's added latency: the part of its cost that
    # depends on how the server's answer arrives (for the same answer it would cancel out).
    add(
        "ns_c1_added_p50_http_minus_raw",
        "off",
        _added(runs, "ns_c1_http", "gw_off", "lat_p50_ms") - _added(runs, "ns_c1", "gw_off", "lat_p50_ms"),
        "ms",
    )
    for name in ("direct", "gw_off", "router"):
        add(f"{name}_reads_per_response", None, _gw(runs, "ns_c1", name, "reads_per_response"), "reads")
    if not router:
        return
    add("router_ns_c1_added_p50_http", None, router_c1, "ms")
    add("router_ns_c32_vs_direct_http", None, _ratio(runs, "ns_c32_http", "router", "direct", "rps"), "x")
    add("router_st_c1_added_ttft_p50_http", None, _added(runs, "st_c1_http", "router", "ttft_p50_ms"), "ms")
    add("router_ns_c1_added_p50_http_minus_raw", None, router_c1 - _added(runs, "ns_c1", "router", "lat_p50_ms"), "ms")
    add("router_ns_c1_added_p50", None, _added(runs, "ns_c1", "router", "lat_p50_ms"), "ms")
    add("router_st_c1_added_ttft_p50", None, _added(runs, "st_c1", "router", "ttft_p50_ms"), "ms")
    add("router_ns_max_rps", None, _gw(runs, "ns_max", "router", "rps"), "req/s", better="higher")
    add("router_cpu_per_request", None, _gw(runs, "ns_max", "router", "cpu_us_per_request"), "us")
    add("router_st_max_chunks_per_s", None, _gw(runs, "st_max", "router", "chunks_per_s"), "chunks/s", better="higher")


def compare_with_last(figs: list[dict], last_path: Path, tolerance_pct: float = 5.0) -> dict[str, Any]:
    """Each figure against the same figure in the previous results file: {name/tracing: {last, now,
    change_pct}} and the keys that moved by more than `tolerance_pct`."""
    try:
        last = {(f["name"], f["tracing"]): f["value"] for f in json.loads(last_path.read_text())["figures"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {"figures": {}, "outside": [], "tolerance_pct": tolerance_pct}
    out: dict[str, dict[str, float]] = {}
    outside = []
    for f in figs:
        before = last.get((f["name"], f["tracing"]))
        if before is None or not before:
            continue
        key = f"{f['name']}/{f['tracing'] or '-'}"
        change = (f["value"] / before - 1) * 100
        out[key] = {"last": before, "now": f["value"], "change_pct": change}
        if abs(change) > tolerance_pct:
            outside.append(key)
    return {"figures": out, "outside": outside, "tolerance_pct": tolerance_pct}


_LABELS = {
    "ns_c1_added_p50": "non-stream C=1 added latency p50",
    "ns_c1_added_p99": "non-stream C=1 added latency p99",
    "ns_c32_added_p50": "non-stream C=32 added latency p50",
    "ns_c32_added_p99": "non-stream C=32 added latency p99",
    "ns_max_rps": "non-stream max req/s (1 process)",
    "ns_cpu_per_request": "CPU per non-stream request (saturated)",
    "ns_c1_cpu_per_request": "CPU per non-stream request (C=1)",
    "st_c1_added_ttft_p50": "stream C=1 added TTFT p50",
    "st_c1_added_ttft_p99": "stream C=1 added TTFT p99",
    "st_c32_added_ttft_p50": "stream C=32 added TTFT p50",
    "st_c32_added_ttft_p99": "stream C=32 added TTFT p99",
    "st_cpu_per_chunk": "CPU per relayed chunk (1 chunk/read)",
    "st_max_chunks_per_s": "stream max relayed chunks/s",
    "st_max_cpu_per_chunk": "CPU per chunk (saturated)",
    "tracing_throughput_cost": "tracing: non-stream throughput cost (paired)",
    "tracing_cpu_per_request": "tracing: added CPU per request",
    "tracing_throughput_cost_repeats": "tracing: same, from the 3 s repeats",
    "tracing_stream_throughput_cost": "tracing: stream throughput cost",
    "exporter_cpu_per_request": "span exporter process CPU per request",
    "spans_dropped": "spans dropped (exporter behind)",
    "direct_max_rps": "direct to backend max req/s (reference)",
    "bare_cpu_per_request": "stack floor: bare relay CPU per request",
    "bare_cpu_per_chunk": "stack floor: bare relay CPU per chunk",
    "st_cpu_per_chunk_over_bare": "CPU per chunk, gateway / bare relay",
    "ns_cpu_per_request_over_bare": "CPU per request, gateway / bare relay",
    "routing_goodput_4_backends": "routing decision, goodput, 4 backends",
    "routing_goodput_16_backends": "routing decision, goodput, 16 backends",
    "rss_idle": "gateway RSS idle",
    "rss_warm": "gateway RSS after warm-up",
    "rss_after_requests": "gateway RSS after all requests",
    "rss_growth_after_warm": "RSS growth warm -> end",
    "ns_c1_added_p50_http": "aiohttp client: non-stream C=1 added p50",
    "ns_c32_vs_direct_http": "aiohttp client: non-stream C=32 req/s / direct",
    "st_c1_added_ttft_p50_http": "aiohttp client: stream C=1 added TTFT p50",
    "ns_c1_added_p50_http_minus_raw": "C=1 added p50, aiohttp minus raw client",
    "direct_reads_per_response": "raw client reads per answer: direct",
    "gw_off_reads_per_response": "raw client reads per answer: gateway",
    "router_reads_per_response": "raw client reads per answer: Rust router",
    "router_ns_c1_added_p50_http": "Rust router, aiohttp: C=1 added p50",
    "router_ns_c32_vs_direct_http": "Rust router, aiohttp: C=32 req/s / direct",
    "router_st_c1_added_ttft_p50_http": "Rust router, aiohttp: stream C=1 added TTFT",
    "router_ns_c1_added_p50_http_minus_raw": "Rust router: C=1 added p50, aiohttp - raw",
    "router_ns_c1_added_p50": "Rust router: non-stream C=1 added p50",
    "router_st_c1_added_ttft_p50": "Rust router: stream C=1 added TTFT p50",
    "router_ns_max_rps": "Rust router: max req/s (on one CPU)",
    "router_cpu_per_request": "Rust router: CPU per request (saturated)",
    "router_st_max_chunks_per_s": "Rust router: max relayed chunks/s",
}


def table(figs: list[dict]) -> str:
    lines = [f"{'figure':44s} {'tracing':7s} {'value':>10s} {'unit':8s} {'target':>9s}  status", "-" * 92]
    for f in figs:
        target = "" if f["target"] is None else ("<= " if f["better"] == "lower" else ">= ") + f"{f['target']:g}"
        v = f["value"]
        value = f"{v:10.3f}" if abs(v) < 100 else f"{v:10.0f}"
        lines.append(
            f"{_LABELS.get(f['name'], f['name']):44s} {f['tracing'] or '-':7s} {value} {f['unit']:8s} "
            f"{target:>9s}  {f['status']}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the Rust router


def start_rust_router(
    stack: contextlib.ExitStack, python: str, backend_port: int, cpu: int | None, tmp: Path
) -> Target:
    """SGLang's Rust router (`sglang-router`, its own venv) over the same backend, on the gateway's
    CPU, with its defaults (round robin over the one worker). Ready once it has registered the
    worker: its first answered request, not its /health, which answers before that."""
    port = free_port()
    cmd = [
        *sglang_cmd(port, [f"http://127.0.0.1:{backend_port}"], "round_robin", python),
        # its Prometheus listener on a free port too (the default one may be taken)
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
    ]
    proc = stack.enter_context(_process(cmd, tmp / "rust-router.log", cpu, ready_url=f"http://127.0.0.1:{port}/health"))
    body = _body(False)
    deadline = time.monotonic() + 60
    while True:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(
                f"the Rust router did not serve a request:\n{(tmp / 'rust-router.log').read_text()[-3000:]}"
            )
        time.sleep(0.2)
    target = Target("router", port, proc.pid, ROUTER_SCENARIOS)
    target.proc = proc
    return target


def stack_procs(targets: list[Target]) -> list[subprocess.Popen]:
    return [t.proc for t in targets if t.proc is not None]


# ---------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gateway_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a few seconds: schema check, figures meaningless")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--server", default="default", help="default (`specroute serve`), or uvicorn | granian (bench.asgi_servers)"
    )
    p.add_argument("--no-tracing", action="store_true", help="only the tracing-off gateway")
    p.add_argument("--scenarios", default=None, help="comma-separated subset of " + ",".join(SCENARIOS))
    p.add_argument("--duration", type=float, default=None, help="seconds per timed level (default 3)")
    p.add_argument("--memory-requests", type=int, default=None, help="total requests before the RSS figure")
    p.add_argument("--output", default=str(REPO / "bench" / "results.json"))
    p.add_argument(
        "--rust-router",
        default=str(REPO / ".venv-router" / "bin" / "python"),
        metavar="PYTHON",
        help="the Python of a venv with sglang-router installed (`make bench` makes .venv-router); "
        "when it is missing the router is left out",
    )
    p.add_argument("--no-rust-router", action="store_true", help="leave SGLang's Rust router out")
    a = p.parse_args(argv)
    router_python = None if a.no_rust_router or not Path(a.rust_router).exists() else a.rust_router
    plan = Plan(a.quick, a.repeats, a.scenarios.split(",") if a.scenarios else None, a.memory_requests, a.duration)

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2
    load_cpu, gw_cpu = (cpus[0], cpus[1]) if pinned else (None, None)
    if pinned:
        assert load_cpu is not None
        os.sched_setaffinity(0, {load_cpu})
    pinning = (
        f"load generator + backend + OTLP sink on CPU {load_cpu}, gateway on CPU {gw_cpu}"
        if pinned
        else "not pinned (one CPU)"
    )
    log(f"pinning: {pinning}")

    tmp = Path(tempfile.mkdtemp(prefix="specroute-bench-"))
    t_start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            bport = free_port()
            backend = stack.enter_context(
                _process(
                    [sys.executable, "-m", "bench.zero_server", "--port", str(bport), "--chunks", str(CHUNKS)],
                    tmp / "backend.log",
                    load_cpu,
                    ready_url=f"http://127.0.0.1:{bport}/health",
                )
            )
            targets = [Target("direct", bport, None)]
            # off; on (every request traced); on10 (10% of traces sampled: throughput scenarios only)
            modes = ["off"] if a.no_tracing else ["off", "on", "on10"]
            gws: dict[str, subprocess.Popen] = {}
            replicas: list[Target] = []
            for mode in modes:
                port = free_port()
                cfg = tmp / f"gateway-{mode}.toml"
                sampled = "\n[tracing]\nsample_ratio = 0.1\n" if mode == "on10" else ""
                cfg.write_text(_gateway_toml(port, bport) + sampled)
                tracing = mode.startswith("on")
                env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{bport}"} if tracing else {}
                env.update({"OTEL_TRACES_EXPORTER": "otlp" if tracing else "none", "PYTHONUNBUFFERED": "1"})
                gws[mode] = stack.enter_context(
                    _process(
                        gateway_command(cfg, a.server),
                        tmp / f"gateway-{mode}.log",
                        gw_cpu,
                        env,
                        ready_url=f"http://127.0.0.1:{port}/health",
                    )
                )
                # tracing on: the raw client's scenarios only (the ordinary client's are about latency, tracing off)
                targets.append(
                    Target(
                        f"gw_{mode}",
                        port,
                        gws[mode].pid,
                        {"off": None, "on": RAW_SCENARIOS}.get(mode, ("ns_c1", "ns_max", "st_max")),
                    )
                )
                if len(modes) > 1:  # more processes of each mode for the paired tracing slices only
                    for k in range(2, plan.tracing_processes + 1):
                        port = free_port()
                        cfg = tmp / f"gateway-{mode}-{k}.toml"
                        cfg.write_text(_gateway_toml(port, bport) + sampled)
                        proc = stack.enter_context(
                            _process(
                                gateway_command(cfg, a.server),
                                tmp / f"gateway-{mode}-{k}.log",
                                gw_cpu,
                                env,
                                ready_url=f"http://127.0.0.1:{port}/health",
                            )
                        )
                        replicas.append(Target(f"gw_{mode}~{k}", port, proc.pid, ()))
            # the stack's floor (bench.bare_relay): the same server and client, no gateway logic
            bare_port = free_port()
            bare_proc = stack.enter_context(
                _process(
                    [sys.executable, "-m", "bench.bare_relay", str(bare_port), str(bport), a.server],
                    tmp / "bare.log",
                    gw_cpu,
                    ready_url=f"http://127.0.0.1:{bare_port}/health",
                )
            )
            bare = Target("bare", bare_port, bare_proc.pid, ("ns_max", "st_c32"))
            extra = [bare]
            if router_python:
                extra.append(start_rust_router(stack, router_python, bport, gw_cpu, tmp))
                log(f"SGLang's Rust router up ({router_python})")
            else:
                log("SGLang's Rust router left out (no --rust-router venv; `make bench` makes one)")
            for t in targets[1:] + replicas:
                if t.name.startswith("gw_on"):
                    exporters = child_pids(t.pid)  # type: ignore[arg-type]  # a gateway started here: pid set
                    if len(exporters) != 1:
                        raise RuntimeError(f"{t.name}: expected one span exporter process, found {exporters}")
                    t.exporter_pid = exporters[0]
                    if pinned:  # every thread: the SDK's batch processor works on its own thread
                        for tid in os.listdir(f"/proc/{t.exporter_pid}/task"):
                            os.sched_setaffinity(int(tid), {cpus[0]})
            time.sleep(1.5)  # first readiness poll and /server_info fallbacks done
            off = targets[1]
            idle = rss_mib(off.pid)  # type: ignore[arg-type]  # a gateway started here: pid set
            log(f"gateways up ({a.server}); idle RSS {idle:.1f} MiB; measuring, {plan.repeats} repeats")
            import uvloop

            exporter_cpu0 = {t.name: cpu_seconds(t.exporter_pid) for t in targets if t.exporter_pid}
            runs = uvloop.run(measure([*targets, *extra], plan, log))
            if len(targets) > 2:
                runs["ns_pairs"] = uvloop.run(measure_tracing(targets[1:] + replicas, plan, log))
            time.sleep(1.0)  # the last span batches leave after OTEL_BSP_SCHEDULE_DELAY (500 ms)
            # over the whole run: every request of every scenario, per request received
            exporter_cpu = {
                t.name: (cpu_seconds(t.exporter_pid) - exporter_cpu0[t.name]) / max(1, t.requests) * 1e6
                for t in targets
                if t.exporter_pid
            }
            warm = rss_mib(off.pid)  # type: ignore[arg-type]  # a gateway started here: pid set
            left = plan.memory_requests - off.requests
            if left > 0:
                log(f"  memory: {left} more requests through gw_off to reach {plan.memory_requests}")
                uvloop.run(run_level(off, _body(False), 32, requests=left))
            after = rss_mib(off.pid)  # type: ignore[arg-type]  # a gateway started here: pid set
            memory = {"idle_mib": idle, "warm_mib": warm, "after_mib": after, "requests": off.requests}
            # measured after the warm-up runs: RSS warm is taken after the repeats, growth is the tail
            from bench.choose import bench_choose

            routing = {
                n: bench_choose("goodput", n, plan.policy_iterations, seed=0, objective="latency") for n in (4, 16)
            }
            for proc in (*gws.values(), backend, bare_proc, *stack_procs(extra)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args!r} died during the run")
            spans_dropped: dict[str, int] = {}
            for t in targets[1:] + replicas:
                mode = t.name.partition("~")[0]
                spans_dropped[mode] = spans_dropped.get(mode, 0) + admin_state(t)["spans_dropped"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    figs = figures(runs, routing, memory, [t.name for t in targets[1:]], spans_dropped, exporter_cpu)
    last_run = compare_with_last(figs, Path(a.output))
    result: dict[str, Any] = {
        "schema": 1,
        "meta": {
            "quick": a.quick,
            "repeats": plan.repeats,
            "server": a.server,
            "pinning": pinning,
            "cpus": len(cpus),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "chunks_per_stream": CHUNKS,
            "duration_s": time.perf_counter() - t_start,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "figures": figs,
        "memory": memory,
        "routing_us": {str(k): v for k, v in routing.items()},
        "vs_last_run": last_run,
        "runs": runs,
    }
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps(result, indent=1) + "\n")
    print(table(figs))
    if last_run["figures"]:
        moved = ", ".join(f"{k} {last_run['figures'][k]['change_pct']:+.1f}%" for k in last_run["outside"]) or "none"
        print(
            f"\nagainst the last run ({a.output} before this one): {len(last_run['figures'])} figures compared, "
            f"{len(last_run['outside'])} moved more than {last_run['tolerance_pct']:g}%: {moved}"
        )
    print(f"\n{pinning}; {plan.repeats} repeats, medians; {result['meta']['duration_s']:.0f} s; -> {a.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
