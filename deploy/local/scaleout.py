#!/usr/bin/env python3
"""Scale-out, measured: N gateway replicas behind HAProxy (Debian's package) in front of the same twins.

    .venv/bin/python deploy/local/scaleout.py                  # the figures of docs/deployment.md
    .venv/bin/python deploy/local/scaleout.py --duration 20    # shorter

Everything runs as processes on 127.0.0.1: three twins of the K2.6 seed systems (k26-ar, k26-eagle3,
k26-dflash) with a small `--max-running-requests` so that the caps bite; gateway replicas (`specroute
serve`, one config, goodput policy, `health.interval_s` 1 s); HAProxy round-robin in front of them,
also for the single replica so that both runs take the same path. Per setup:

- steady load: `loadgen` closed loop at a fixed concurrency for `--duration` seconds through HAProxy;
  from its requests.jsonl the backend share and the mean per-request tok/s (decode and end to end,
  converted back to the twins' simulated time);
- a burst: `--burst` streaming requests sent at once through HAProxy, while each twin's /v1/loads is
  polled every 10 ms; overshoot = the most requests a backend held beyond its `max_running_requests`
  (its waiting queue, running + waiting - cap), the figure `admission.backend_max_inflight` bounds.

Setups: 1 replica, 3 replicas, and 3 replicas with `backend_max_inflight` = ceil(cap / 3). With
`backend_max_inflight` = B per replica (0: the backend's cap C), N replicas can send a backend at most
N x min(B, C) at once, so overshoot <= N x min(B, C) - C; the script checks the measured overshoot
against that bound and prints a table (and --json FILE for the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.processes import ProcessGroup, free_port

BIN = Path(sys.executable).parent
TWINS = (("k26-ar", "ar"), ("k26-eagle3", "eagle3"), ("k26-dflash", "dflash"))
MODEL = "kimi-k2.6"


@contextlib.contextmanager
def setup(
    workdir: Path, replicas: int, cap: int, backend_max_inflight: int, time_scale: float, seed: int
) -> Iterator[tuple[str, dict[str, str], list[str]]]:
    """Twins, `replicas` gateways and HAProxy; yields (HAProxy URL, {backend name: twin URL}, gateway URLs)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ProcessGroup(log_dir=workdir) as procs:
        twins: dict[str, str] = {}
        for i, (name, _) in enumerate(TWINS):
            port = free_port()
            procs.start(
                name,
                [
                    str(BIN / "specroute"),
                    "sim",
                    "--profile",
                    name,
                    "--port",
                    str(port),
                    "--time-scale",
                    str(time_scale),
                    "--max-running-requests",
                    str(cap),
                    "--seed",
                    str(seed + i),
                ],
            )
            twins[name] = f"http://127.0.0.1:{port}"
            procs.wait_ready({name: f"{twins[name]}/ready"})
        gateways = []
        for r in range(replicas):
            port = free_port()
            text = (
                f'[gateway]\nlisten = "127.0.0.1:{port}"\npolicy = "goodput"\n\n[health]\ninterval_s = 1.0\n\n'
                f"[admission]\nbackend_max_inflight = {backend_max_inflight}\n"
            )
            for name, strategy in TWINS:
                text += (
                    f'\n[[backends]]\nname = "{name}"\nurl = "{twins[name]}"\nmodel = "{MODEL}"\n'
                    f'strategy = "{strategy}"\n'
                )
            path = workdir / f"gateway-{r}.toml"
            path.write_text(text)
            procs.start(f"gateway-{r}", [str(BIN / "specroute"), "serve", "--config", str(path)])
            procs.wait_ready({f"gateway-{r}": f"http://127.0.0.1:{port}/ready"})
            gateways.append(port)
        lb_port = free_port()
        servers = "\n".join(f"    server gw{i} 127.0.0.1:{p} check inter 1s" for i, p in enumerate(gateways))
        (workdir / "haproxy.cfg").write_text(f"""global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend specroute
    bind 127.0.0.1:{lb_port}
    default_backend gateways
backend gateways
    balance roundrobin
    option httpchk GET /ready
{servers}
""")
        procs.start("haproxy", [haproxy_binary(), "-f", str(workdir / "haproxy.cfg"), "-db"])
        procs.wait_ready({"haproxy": f"http://127.0.0.1:{lb_port}/ready"})
        yield f"http://127.0.0.1:{lb_port}", twins, [f"http://127.0.0.1:{p}" for p in gateways]


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise SystemExit("scaleout: needs HAProxy (Debian: apt-get install haproxy)")
    return found


def steady(url: str, out: Path, concurrency: int, duration: float, time_scale: float, seed: int) -> dict[str, Any]:
    """loadgen through the balancer; per-request figures back in simulated time (rates x time_scale)."""
    argv = [
        str(BIN / "loadgen"),
        "--target",
        url,
        "--model",
        MODEL,
        "--concurrency",
        str(concurrency),
        "--duration",
        str(duration),
        "--warmup",
        str(2 * concurrency),
        "--dataset",
        "mixed",
        "--max-tokens",
        "128",
        "--seed",
        str(seed),
        "--output",
        str(out),
        "--no-plots",
        "--no-progress",
    ]
    subprocess.run(argv, check=True, capture_output=True, timeout=duration * 4 + 120)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines() if line.strip()]
    ok = [r for r in records if r["ok"]]
    share: dict[str, float] = {}
    for r in ok:
        share[r["backend"]] = share.get(r["backend"], 0) + 1 / len(ok)
    decode = [r["decode_throughput"] * time_scale for r in ok if r.get("decode_throughput")]
    e2e = [r["output_throughput"] * time_scale for r in ok if r.get("output_throughput")]
    return {
        "requests": len(records),
        "failed": len(records) - len(ok),
        "share": dict(sorted(share.items())),
        "mean_decode_tok_s": sum(decode) / len(decode),
        "mean_e2e_tok_s": sum(e2e) / len(e2e),
    }


async def burst(url: str, twins: dict[str, str], gateways: list[str], n: int, cap: int) -> dict[str, Any]:
    """`n` streaming requests at once. While they run, each twin's /v1/loads and each gateway's /metrics are
    polled: the most requests a backend held (running + waiting) and the most each replica had in flight
    to each backend (specroute_inflight)."""
    import aiohttp

    peak = dict.fromkeys(twins, 0)
    replica_peak = [dict.fromkeys(twins, 0) for _ in gateways]
    done = asyncio.Event()

    async def poll_twin(session: aiohttp.ClientSession, name: str, base: str) -> None:
        while not done.is_set():
            async with session.get(f"{base}/v1/loads") as r:
                load = (await r.json())["loads"][0]
            peak[name] = max(peak[name], load["num_running_reqs"] + load["num_waiting_reqs"])
            await asyncio.sleep(0.01)

    async def poll_gateway(session: aiohttp.ClientSession, i: int, base: str) -> None:
        while not done.is_set():
            async with session.get(f"{base}/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if line.startswith('specroute_inflight{backend="'):
                    name = line.split('"')[1]
                    replica_peak[i][name] = max(replica_peak[i].get(name, 0), int(float(line.split()[-1])))
            await asyncio.sleep(0.01)

    async def one(session: aiohttp.ClientSession, i: int) -> int:
        body = {
            "model": MODEL,
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": f"Explain step {i} of a binary search."}],
        }
        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
            async for _ in r.content:
                pass
            return r.status

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        pollers = [asyncio.create_task(poll_twin(session, name, base)) for name, base in twins.items()]
        pollers += [asyncio.create_task(poll_gateway(session, i, base)) for i, base in enumerate(gateways)]
        await asyncio.sleep(0.1)
        statuses = await asyncio.gather(*(one(session, i) for i in range(n)))
        done.set()
        await asyncio.gather(*pollers)
    return {
        "requests": n,
        "status_200": sum(s == 200 for s in statuses),
        "peak_held": peak,
        "overshoot": {k: max(0, v - cap) for k, v in peak.items()},
        "replica_peak_inflight": replica_peak,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of steady load per setup")
    p.add_argument("--concurrency", type=int, default=18, help="requests in flight in the steady phase")
    p.add_argument("--cap", type=int, default=8, help="each twin's --max-running-requests")
    p.add_argument("--burst", type=int, default=72, help="requests sent at once in the burst phase")
    p.add_argument("--time-scale", type=float, default=0.5, help="the twins' --time-scale")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    haproxy_binary()
    setups = [(1, 0), (3, 0), (3, math.ceil(args.cap / 3))]
    results = []
    with tempfile.TemporaryDirectory(prefix="specroute-scaleout-") as tmp:
        for replicas, bmi in setups:
            work = Path(tmp) / f"r{replicas}-b{bmi}"
            with setup(work, replicas, args.cap, bmi, args.time_scale, args.seed) as (url, twins, gateways):
                row: dict[str, Any] = {"replicas": replicas, "backend_max_inflight": bmi}
                row["steady"] = steady(
                    url, work / "loadgen", args.concurrency, args.duration, args.time_scale, args.seed
                )
                time.sleep(3)  # the steady phase drains; every replica's poll sees idle backends
                row["burst"] = asyncio.run(burst(url, twins, gateways, args.burst, args.cap))
                per_replica = min(bmi or args.cap, args.cap)
                row["overshoot_bound"] = max(0, replicas * per_replica - args.cap)
                row["within_bound"] = all(
                    v <= per_replica for peaks in row["burst"]["replica_peak_inflight"] for v in peaks.values()
                )
                results.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    base = results[0]["steady"]
    print(
        f"\ntwins: {', '.join(n for n, _ in TWINS)}, cap {args.cap} each, time scale {args.time_scale}; "
        f"steady: concurrency {args.concurrency}, {args.duration:.0f} s; burst: {args.burst} at once"
    )
    print(
        "| replicas | backend_max_inflight | backend share (ar/eagle3/dflash) | mean decode tok/s | vs 1 replica "
        "| mean e2e tok/s | vs 1 replica | burst overshoot per backend (bound) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in results:
        s = row["steady"]
        share = "/".join(f"{s['share'].get(n, 0):.2f}" for n, _ in TWINS)
        over = "/".join(str(row["burst"]["overshoot"][n]) for n, _ in TWINS)
        print(
            f"| {row['replicas']} | {row['backend_max_inflight'] or '0 (cap)'} | {share} "
            f"| {s['mean_decode_tok_s']:.1f} | {s['mean_decode_tok_s'] / base['mean_decode_tok_s'] - 1:+.1%} "
            f"| {s['mean_e2e_tok_s']:.1f} | {s['mean_e2e_tok_s'] / base['mean_e2e_tok_s'] - 1:+.1%} "
            f"| {over} (<= {row['overshoot_bound']}) |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2) + "\n"
        )
    return 0 if all(r["within_bound"] for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
