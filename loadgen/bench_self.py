"""loadgen's own cost: can one loadgen process keep up, and does it count right?

Starts the zero-delay test server as a separate process (its own core when the machine has two),
drives it with loadgen's real runner from this process (pinned to one core), then compares:

- chunks/s loadgen sustained (streamed content chunks received / level wall time),
  target >= 5,000 chunks/s;
- loadgen's aggregate output tok/s against the server-side count (tokens the server finished /
  the server's first-request-to-last-finish span), target within 1%;
- loadgen's CPU time per chunk (how much headroom is left).

    python -m loadgen.bench_self [--concurrency 32] [--duration 5] [--max-tokens 256]

Exit status 0 when both targets are met.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import time
import urllib.request

import msgspec

from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelSpec
from loadgen.runner import Plan, execute
from loadgen.testserver import Stats
from tools.processes import free_port, spawn, stop, wait_ready

MIN_CHUNKS_PER_S = 5000.0
MAX_REL_ERROR = 0.01


def _stats(url: str) -> Stats:
    with urllib.request.urlopen(url + "/stats", timeout=5) as r:
        return msgspec.json.decode(r.read(), type=Stats)


def _pin(cpu: int) -> bool:
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        return False
    os.sched_setaffinity(0, {cpu})
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadgen.bench_self", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0, help="seconds of measured closed-loop load (default 5)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument(
        "--chunk-delay",
        type=float,
        default=0.0,
        help="server pause between chunks: spreads chunks over time so each arrives "
        "in its own read, the costlier case for the client (default 0)",
    )
    a = p.parse_args(argv)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_cmd = [
        sys.executable,
        "-m",
        "loadgen.testserver",
        "--port",
        str(port),
        "--tokens-per-chunk",
        str(a.tokens_per_chunk),
        "--chunk-delay",
        str(a.chunk_delay),
    ]
    pinned = (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity")
    # server on CPU 1, loadgen on CPU 0: "one loadgen process on one core"
    server = spawn(server_cmd, cpu=1 if pinned else None)
    try:
        wait_ready(url + "/ready", proc=server, timeout_s=20.0, name="test server")
        if pinned:
            _pin(0)
        from rich.console import Console

        quiet = Console(file=io.StringIO())  # the tables are not what the bench measures

        def plan(n: int, duration: float | None = None) -> Plan:
            return Plan(
                targets=[url],
                gateway_url=url,
                model=None,
                dataset=load_dataset("mixed"),
                levels=[LevelSpec(concurrency=a.concurrency, num_prompts=n, duration=duration)],
                opts=RequestOptions(max_tokens=a.max_tokens),
                progress=False,
            )

        _run(plan(a.concurrency), quiet)  # warmup: connections, imports, JIT-free but warm
        urllib.request.urlopen(urllib.request.Request(url + "/stats/reset", method="POST"), timeout=5).close()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        summary, errors = _run(plan(0, a.duration), quiet)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if errors:
            print(f"bench: failed: {errors[0]}", file=sys.stderr)
            return 1
        stats = _stats(url)
    finally:
        stop(server)

    level = summary.runs[0].levels[0]
    chunks = round(level.total_output_tokens / (level.mean_tokens_per_chunk or 1))
    chunks_per_s = chunks / level.duration
    # Server side, independently: tokens it finished over its own first-request-to-last-finish
    # span, measured with its own clock in its own process.
    span = (stats.last_end or 0.0) - (stats.first_request or 0.0)
    server_rate = stats.tokens / span if span > 0 else 0.0
    server_tokens = stats.tokens
    rel = abs(level.output_throughput - server_rate) / server_rate if server_rate else 1.0
    ok = chunks_per_s >= MIN_CHUNKS_PER_S and rel <= MAX_REL_ERROR and level.failed == 0
    print(f"loadgen self-benchmark ({'pinned: loadgen cpu0, server cpu1' if pinned else 'unpinned'})")
    print(
        f"  requests            {level.completed} ok, {level.failed} failed "
        f"at concurrency {a.concurrency}, {a.max_tokens} tokens each"
    )
    print(f"  wall time           {level.duration:.3f} s")
    print(f"  chunks received     {chunks:,}  ->  {chunks_per_s:,.0f} chunks/s (target >= {MIN_CHUNKS_PER_S:,.0f})")
    print(
        f"  loadgen CPU         {cpu:.2f} s  ->  {cpu / max(chunks, 1) * 1e6:.1f} us/chunk "
        f"({cpu / wall * 100:.0f}% of one core over {wall:.2f} s)"
    )
    print(
        f"  aggregate tok/s     loadgen {level.output_throughput:,.1f}  server-side "
        f"{server_rate:,.1f}  error {rel * 100:.3f}% (target <= {MAX_REL_ERROR * 100:g}%)"
    )
    print(
        f"  tokens              loadgen {level.total_output_tokens:,}  server {server_tokens:,}"
        f"  chunks: loadgen {chunks:,}  server {stats.chunks:,}"
    )
    print("  result              " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def _run(plan: Plan, console):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(execute(plan, console))
    return uvloop.run(execute(plan, console))


if __name__ == "__main__":
    sys.exit(main())
