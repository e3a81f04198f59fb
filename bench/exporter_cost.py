"""What tracing costs at a steady 1,000 requests/s: the gateway's CPU per request and latency with
tracing off and on, and the span exporter process's own CPU per request.

    python -m bench.exporter_cost [--rate 1000] [--seconds 5] [--rounds 4]

Why a fixed rate: at saturation (`bench.gateway_bench`'s `ns_max`) every CPU cycle the exporter
process takes could have served requests, so its cost shows up as throughput; a gateway in service
runs below saturation, and the question there is whether the exporter process (which encodes and
sends the spans, on the machine's other CPU, at idle priority) slows the request path at all.

`--baseline DIR` adds a third gateway, tracing on, run from another checkout of the repository (a
`git worktree` of an earlier commit, say) and measured in the same interleaved rounds: a before/after
of a change to the tracing path in one run, which a shared machine's drift cannot tell apart from
two runs.

Processes as in `bench.gateway_bench`: the zero-delay backend (also the OTLP/HTTP sink) and this
load generator on CPU 0, the gateways on CPU 1, a tracing gateway's exporter process moved to CPU 0
(a collector-side process). Off and on alternate in `--seconds` slices for `--rounds` rounds; the
figures are medians over rounds. The exporter's CPU is counted over the whole run, including the
time it takes to work off the last slice's spans.
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

from bench.client import paced
from bench.gateway_bench import Target, _body, _gateway_toml, _process, child_pids, cpu_seconds, quiesce, run_level
from common.percentile import percentile
from tools.processes import free_port


async def _slice(target: Target, rate: float, seconds: float) -> dict[str, float]:
    cpu0 = cpu_seconds(target.pid) if target.pid else 0.0
    res = await paced("127.0.0.1", target.port, target.raw(_body(False)), rate, seconds)
    cpu = cpu_seconds(target.pid) - cpu0 if target.pid else 0.0
    target.requests += res.count + res.errors
    return {
        "rps": res.count / res.wall,
        "errors": res.errors,
        "cpu_us_per_request": cpu / max(1, res.count) * 1e6,
        "p50_ms": (percentile(res.latencies, 50) or 0.0) * 1e3,
        "p99_ms": (percentile(res.latencies, 99) or 0.0) * 1e3,
    }


async def _measure(targets: list[Target], rate: float, seconds: float, rounds: int) -> dict[str, list[dict]]:
    for t in targets:  # warm-up: connections, policy estimates, code paths
        await run_level(t, _body(False), 8, requests=2000)
    out: dict[str, list[dict]] = {t.name: [] for t in targets}
    previous: Target | None = None
    for rnd in range(rounds):
        for t in targets if rnd % 2 == 0 else targets[::-1]:
            await quiesce(previous)
            previous = t
            out[t.name].append(await _slice(t, rate, seconds))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.exporter_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    p.add_argument("--seconds", type=float, default=5.0, help="per slice")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout: its gateway (tracing on) is measured beside this one's",
    )
    p.add_argument(
        "--exporter-cpu",
        choices=("load", "gateway"),
        default="load",
        help="the exporter process beside the load generator (a collector-side process, the "
        "benchmark's layout) or on the gateway's own CPU (the worst case for the request path)",
    )
    a = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    load_cpu, gw_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        bport = free_port()
        stack.enter_context(
            _process(
                [sys.executable, "-m", "bench.zero_server", "--port", str(bport)],
                tmp / "backend.log",
                load_cpu,
                ready_url=f"http://127.0.0.1:{bport}/health",
            )
        )
        targets = []
        modes = ["off", "on"] + (["baseline"] if a.baseline else [])
        for mode in modes:
            port = free_port()
            config = tmp / f"gateway-{mode}.toml"
            config.write_text(_gateway_toml(port, bport))
            env = (
                {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{bport}", "OTEL_TRACES_EXPORTER": "otlp"}
                if mode != "off"
                else {"OTEL_TRACES_EXPORTER": "none"}
            )
            if mode == "baseline":  # its own code first on the path, for the gateway and its exporter process
                env["PYTHONPATH"] = str(a.baseline.resolve())
            proc = stack.enter_context(
                _process(
                    [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
                    tmp / f"gateway-{mode}.log",
                    gw_cpu,
                    env,
                    ready_url=f"http://127.0.0.1:{port}/health",
                    cwd=a.baseline if mode == "baseline" else None,
                )
            )
            target = Target(f"gw_{mode}", port, proc.pid)
            if mode != "off":
                (target.exporter_pid,) = child_pids(proc.pid)
                exporter_cpu = load_cpu if a.exporter_cpu == "load" else gw_cpu
                if exporter_cpu is not None:  # every thread of it, as the benchmark does
                    for tid in os.listdir(f"/proc/{target.exporter_pid}/task"):
                        os.sched_setaffinity(int(tid), {exporter_cpu})
            targets.append(target)
        time.sleep(1.5)  # the first readiness poll done
        exporter_pids = {t.name: t.exporter_pid for t in targets if t.exporter_pid is not None}
        traced = [t for t in targets if t.name in exporter_pids]
        exporter0 = {name: cpu_seconds(pid) for name, pid in exporter_pids.items()}
        runs = uvloop.run(_measure(targets, a.rate, a.seconds, a.rounds))
        time.sleep(1.0)  # the last span batch leaves after OTEL_BSP_SCHEDULE_DELAY
        exporter_us = {}
        for t in traced:
            uvloop.run(quiesce(t))
            exporter_us[t.name] = (cpu_seconds(exporter_pids[t.name]) - exporter0[t.name]) / max(1, t.requests) * 1e6

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    print(
        f"{a.rate:.0f} req/s offered, {a.rounds} rounds of {a.seconds:g} s, medians; "
        f"exporter process on the {a.exporter_cpu} CPU"
    )
    print(
        f"{'':12s} {'req/s':>8s} {'CPU us/req':>11s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s} "
        f"{'exporter us/req':>16s}"
    )
    for t in targets:
        errors = sum(r["errors"] for r in runs[t.name])
        exporter = f"{exporter_us[t.name]:16.1f}" if t.name in exporter_us else f"{'-':>16s}"
        print(
            f"{t.name:12s} {med(t.name, 'rps'):8.0f} {med(t.name, 'cpu_us_per_request'):11.1f} "
            f"{med(t.name, 'p50_ms'):8.3f} {med(t.name, 'p99_ms'):8.3f} {errors:7.0f} {exporter}"
        )
    for t in traced:
        # per round, so a round's drift hits both sides alike
        over = (
            statistics.median(
                on["cpu_us_per_request"] / off["cpu_us_per_request"] - 1
                for on, off in zip(runs[t.name], runs["gw_off"], strict=True)
            )
            * 100
        )
        print(
            f"{t.name}: gateway CPU per request {over:+.1f}% over gw_off (median of per-round ratios); its "
            f"exporter process {exporter_us[t.name]:.1f} us per request, "
            f"{exporter_us[t.name] * a.rate / 1e4:.1f}% of one CPU at {a.rate:.0f} req/s"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
