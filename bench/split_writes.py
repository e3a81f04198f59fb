"""What an answer sent in two writes costs an ordinary client: the zero-delay backend answering each
non-streamed request in one write, and a second one writing the head and then the body (as an ASGI
server does: uvicorn writes `http.response.start` and `http.response.body` as they come, and the
gateway's non-streamed answers reach the client that way), measured by both benchmark clients.

    python -m bench.split_writes [--requests 2000] [--rounds 5]

The raw client parses whatever arrives in one callback, so it barely notices. aiohttp resolves the
response when its head arrives and the body read is a second wake-up of the waiting task: the
difference between the two servers, per client, is what the split costs that client at C=1. The
servers run on CPU 1, the clients on CPU 0 (when there are two); the rounds alternate the servers
and the figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench.gateway_bench import Target, _body, _process, run_level
from tools.processes import free_port


async def _rounds(servers: dict[str, Target], requests: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    body = _body(False)
    out: dict[str, dict[str, list[float]]] = {}
    for t in servers.values():  # warm-up, both clients
        for client in ("raw", "http"):
            await run_level(t, body, 1, requests=200, client=client)
    for rnd in range(rounds):
        for client in ("raw", "http"):
            for t in list(servers.values())[:: 1 if rnd % 2 == 0 else -1]:
                own = time.process_time()
                r = await run_level(t, body, 1, requests=requests, client=client)
                client_us = (time.process_time() - own) / max(1, r["n"]) * 1e6
                key = f"{t.name}/{client}"
                out.setdefault(key, {"p50_ms": [], "client_us": [], "server_us": []})
                out[key]["p50_ms"].append(r["lat_p50_ms"])
                out[key]["client_us"].append(client_us)
                out[key]["server_us"].append(r["cpu_us_per_request"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.split_writes", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="per level")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        servers = {}
        for name, extra in (("one_write", []), ("two_writes", ["--split-writes"])):
            port = free_port()
            proc = stack.enter_context(
                _process(
                    [sys.executable, "-m", "bench.zero_server", "--port", str(port), *extra],
                    Path(d) / f"{name}.log",
                    server_cpu,
                    ready_url=f"http://127.0.0.1:{port}/health",
                )
            )
            servers[name] = Target(name, port, proc.pid)
        out = uvloop.run(_rounds(servers, a.requests, a.rounds))
    print(f"C=1 non-streamed, {a.requests} requests x {a.rounds} rounds, medians")
    print(f"{'server/client':22s} {'p50 ms':>8s} {'client CPU us/req':>18s} {'server CPU us/req':>18s}")
    for key, v in out.items():
        print(
            f"{key:22s} {statistics.median(v['p50_ms']):8.3f} {statistics.median(v['client_us']):18.1f} "
            f"{statistics.median(v['server_us']):18.1f}"
        )
    for client in ("raw", "http"):
        one, two = out[f"one_write/{client}"], out[f"two_writes/{client}"]
        dp50 = statistics.median(b - c for b, c in zip(two["p50_ms"], one["p50_ms"], strict=True))
        dcpu = statistics.median(b - c for b, c in zip(two["client_us"], one["client_us"], strict=True))
        print(
            f"{client:5s} client: two writes cost {dp50 * 1e3:+.0f} us of p50 and {dcpu:+.1f} us of its CPU per request"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
