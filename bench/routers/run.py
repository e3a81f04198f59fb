"""Side by side on the same twins: specroute, SGLang's router, LiteLLM, and each backend alone.

    make bench-routers                      # or: python -m bench.routers [--quick] [--output DIR]

The pool is the four K2.6 twins (`specroute sim`: k26-ar, k26-eagle3, k26-dflash, k26-ddtree) at
`--time-scale` (default 0.5: twice as fast as the hardware they model; at 0.1 a 2-core machine is
CPU-bound at C=32 and every figure measures Python, not the pool). Every contestant gets
fresh twins (empty radix caches, fresh lifetime statistics) and the same loadgen runs, one after the
other on this machine:

- `closed-c4`, `closed-c32`: closed loop, loadgen's `mixed` dataset, 160-token streams;
- `open`: Poisson arrivals at `--rate` requests per simulated second, uncapped;
- `sessions`: loadgen's multi-turn `sessions` dataset, each turn sending the history with the
  answers the server gave (the session is the unit of concurrency).

Contestants: specroute (its default policy, no options); SGLang's router with round_robin,
power_of_two and cache_aware; LiteLLM with simple-shuffle and least-busy; each twin alone. The
peers know nothing about speculation, so each also runs in the configuration an operator would
give them knowing the pool (`-noar`: the AR backend left out).

Figures are in simulated time (wall-clock durations / time scale, rates x time scale), as loadgen's
`timescale` module defines them: mean request tok/s (output tokens / e2e, averaged over requests),
e2e p50/p99, TTFT p99, SLO goodput (requests per second with TTFT <= 5 s and TPOT <= 60 ms, as
DistServe counts it), errors, and the router's CPU (its process tree's CPU seconds over the run's
wall seconds; one core = 100%). The table compares specroute with the best peer configuration of
each workload. Results go to `--json` (default bench/routers/bench-routers.json); logs and
loadgen's outputs to `--output`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.routers import peers
from common.percentile import percentile
from tools.processes import ProcessGroup, free_port, specroute_cmd, wait_measured
from tools.topology import start_twins

__all__ = ["main"]

MODEL = "kimi-k2.6"
PROFILES = ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree")
STRATEGIES = {"k26-ar": "ar", "k26-eagle3": "eagle3", "k26-dflash": "dflash", "k26-ddtree": "ddtree"}
SLO_TTFT_S, SLO_TPOT_S = 5.0, 0.060


@dataclass(frozen=True)
class Workload:
    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Contestant:
    name: str
    kind: str  # specroute | sglang | litellm | direct
    option: str = ""
    backends: tuple[str, ...] = PROFILES


@dataclass
class Result:
    contestant: str
    workload: str
    requests: int = 0
    errors: int = 0
    mean_request_tok_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    ttft_p99_s: float | None = None
    slo_goodput_rps: float | None = None
    router_cpu_pct: float | None = None
    backends: dict[str, int] = field(default_factory=dict)


def workloads(rate: float, scale: float, quick: bool) -> list[Workload]:
    n = 1 if quick else 2
    common = ("--max-tokens", "160", "--seed", "0")
    return [
        Workload("closed-c4", ("--concurrency", "4", "--num-prompts", str(12 * n), "--dataset", "mixed", *common)),
        Workload("closed-c32", ("--concurrency", "32", "--num-prompts", str(48 * n), "--dataset", "mixed", *common)),
        Workload(
            "open",
            (
                "--concurrency",
                "inf",
                "--request-rate",
                f"{rate / scale:g}",
                "--num-prompts",
                str(60 * n),
                "--dataset",
                "mixed",
                *common,
            ),
        ),
        Workload(
            "sessions",
            ("--concurrency", "8", "--num-prompts", str(8 * n), "--max-turns", "4", "--dataset", "sessions", *common),
        ),
    ]


def contestants(quick: bool) -> list[Contestant]:
    noar = tuple(p for p in PROFILES if p != "k26-ar")
    out = [Contestant("specroute", "specroute")]
    for policy in peers.SGLANG_POLICIES:
        out.append(Contestant(f"sgl/{policy}", "sglang", policy))
        out.append(Contestant(f"sgl/{policy}-noar", "sglang", policy, noar))
    for strategy in peers.LITELLM_STRATEGIES if not quick else ("least-busy",):
        out.append(Contestant(f"litellm/{strategy}", "litellm", strategy))
        out.append(Contestant(f"litellm/{strategy}-noar", "litellm", strategy, noar))
    out += [Contestant(f"only:{p}", "direct", backends=(p,)) for p in PROFILES]
    return out


# ----------------------------------------------------------------------------- processes


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    tick = 100.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        p = int(entry.name)
        children.setdefault(int(fields[1]), []).append(p)
        stats[p] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo += children.get(p, [])
    return total


@contextmanager
def _router(c: Contestant, workers: dict[str, str], group: ProcessGroup, tmp: Path) -> Iterator[tuple[str, int | None]]:
    """Start the contestant's router over `workers`; yields (base URL, router pid)."""
    urls = [workers[b] for b in c.backends]
    if c.kind == "direct":
        yield urls[0], None
        return
    port = free_port()
    if c.kind == "specroute":
        config = tmp / f"specroute-{port}.toml"
        lines = [f'[gateway]\nlisten = "127.0.0.1:{port}"\n']
        for b in c.backends:
            lines.append(
                f'[[backends]]\nname = "{b}"\nurl = "{workers[b]}"\nmodel = "{MODEL}"\nstrategy = "{STRATEGIES[b]}"\n'
            )
        config.write_text("\n".join(lines))
        proc = group.start("router", specroute_cmd("serve", "--config", str(config)), log_file=tmp / "specroute.log")
        ready = f"http://127.0.0.1:{port}/health"
    elif c.kind == "sglang":
        proc = group.start(
            "router", peers.sglang_cmd(port, urls, c.option), log_file=tmp / "sglang.log", env=peers.offline_env()
        )
        ready = f"http://127.0.0.1:{port}/health"
    else:
        config = tmp / f"litellm-{port}.yaml"
        config.write_text(peers.litellm_config(MODEL, urls, c.option))
        proc = group.start(
            "router", peers.litellm_cmd(port, config), log_file=tmp / "litellm.log", env=peers.offline_env()
        )
        ready = f"http://127.0.0.1:{port}/health/liveliness"
    try:
        group.wait_ready({"router": ready}, timeout_s=180)
        if c.kind == "sglang":
            # its /health answers before the workers are registered; until then every request,
            # loadgen's /v1/models first, is a 503 "No models available"
            group.wait_ready({"router": f"http://127.0.0.1:{port}/v1/models"}, timeout_s=60)
        if c.kind == "specroute":
            wait_measured(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        group.stop("router")


# ------------------------------------------------------------------------------- figures


def figures(result: Result, requests: list[dict[str, Any]], scale: float, wall_s: float) -> None:
    ok = [r for r in requests if r.get("ok")]
    result.requests = len(requests)
    result.errors = len(requests) - len(ok)
    rates = [
        r["output_tokens"] / (r["e2e_ms"] / 1000) * scale for r in ok if r.get("e2e_ms") and r.get("output_tokens")
    ]
    e2e = [r["e2e_ms"] / 1000 / scale for r in ok if r.get("e2e_ms") is not None]
    ttft = [r["ttft_ms"] / 1000 / scale for r in ok if r.get("ttft_ms") is not None]
    result.mean_request_tok_s = statistics.fmean(rates) if rates else None
    result.e2e_p50_s, result.e2e_p99_s = percentile(e2e, 50), percentile(e2e, 99)
    result.ttft_p99_s = percentile(ttft, 99)
    good = sum(
        1
        for r in ok
        if r.get("ttft_ms") is not None
        and r["ttft_ms"] / 1000 / scale <= SLO_TTFT_S
        and (r.get("tpot_ms") is None or r["tpot_ms"] / 1000 / scale <= SLO_TPOT_S)
    )
    result.slo_goodput_rps = good / (wall_s / scale) if wall_s > 0 else None
    for r in ok:
        name = r.get("backend") or "-"
        result.backends[name] = result.backends.get(name, 0) + 1


def _loadgen(url: str, key: str | None, w: Workload, out: Path) -> tuple[list[dict[str, Any]], float]:
    cmd = [
        sys.executable,
        "-m",
        "loadgen",
        "--target",
        url,
        "--model",
        MODEL,
        "--output",
        str(out),
        "--no-progress",
        "--no-plots",
        *w.args,
    ]
    if key:
        cmd += ["--api-key", key]
    t0 = time.monotonic()
    with open(out.parent / f"{out.name}.err", "wb") as err:
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=err)
    wall = time.monotonic() - t0
    path = out / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if rows:
        starts = [r.get("start_s", 0.0) for r in rows]
        ends = [r.get("start_s", 0.0) + (r.get("e2e_ms") or 0) / 1000 for r in rows]
        wall = max(ends) - min(starts)
    return rows, wall


# ---------------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> list[Result]:
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    chosen = [c for c in contestants(args.quick) if not args.only or any(s in c.name for s in args.only.split(","))]
    for c in chosen:
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-{c.name.replace('/', '_').replace(':', '_')}-", dir=out))
        with ProcessGroup(log_dir=tmp) as group:
            ports = start_twins(
                group, dict.fromkeys(c.backends, ("--enable-cache-report",)), time_scale=args.time_scale
            )
            workers = {p: f"http://127.0.0.1:{port}" for p, port in ports.items()}
            with _router(c, workers, group, tmp) as (url, pid):
                key = peers.MASTER_KEY if c.kind == "litellm" else None
                for w in workloads(args.rate, args.time_scale, args.quick):
                    cpu0 = _cpu_seconds(pid) if pid else 0.0
                    t0 = time.monotonic()
                    rows, wall = _loadgen(url, key, w, tmp / w.name)
                    elapsed = time.monotonic() - t0
                    r = Result(contestant=c.name, workload=w.name)
                    figures(r, rows, args.time_scale, wall)
                    if pid:
                        r.router_cpu_pct = 100.0 * (_cpu_seconds(pid) - cpu0) / elapsed if elapsed > 0 else None
                    results.append(r)
                    print(_row(r), flush=True)
    return results


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _row(r: Result) -> str:
    return (
        f"{r.workload:11s} {r.contestant:26s} {_f(r.mean_request_tok_s):>8s} {_f(r.e2e_p50_s, 2):>7s} "
        f"{_f(r.e2e_p99_s, 2):>7s} {_f(r.ttft_p99_s, 2):>7s} {_f(r.slo_goodput_rps, 2):>7s} "
        f"{r.errors:>4d}/{r.requests:<4d} {_f(r.router_cpu_pct, 0):>5s}"
    )


HEADER = (
    f"{'workload':11s} {'contestant':26s} {'req tok/s':>8s} {'e2e p50':>7s} {'e2e p99':>7s} "
    f"{'ttft p99':>7s} {'SLO r/s':>7s} {'err/n':>9s} {'cpu %':>5s}"
)


def verdicts(results: list[Result]) -> list[dict[str, Any]]:
    """Per workload: specroute against the best peer configuration (highest mean request tok/s)."""
    out = []
    for w in sorted({r.workload for r in results}):
        rows = [r for r in results if r.workload == w]
        ours = next((r for r in rows if r.contestant == "specroute"), None)
        peers = [r for r in rows if r.contestant.startswith(("sgl/", "litellm/"))]
        peer_rows = [r for r in peers if r.mean_request_tok_s is not None and r.errors == 0]
        single = [r for r in rows if r.contestant.startswith("only:") and r.mean_request_tok_s is not None]
        # a peer that served nothing (it never came up) is missing from the comparison, not beaten
        missing = sorted(r.contestant for r in peers if not r.requests)
        if ours is None or ours.mean_request_tok_s is None or not peer_rows:
            continue
        best = max(peer_rows, key=lambda r: r.mean_request_tok_s or 0.0)
        best_single = max(single, key=lambda r: r.mean_request_tok_s or 0.0) if single else None
        ratio = ours.mean_request_tok_s / best.mean_request_tok_s if best.mean_request_tok_s else None
        out.append(
            {
                "workload": w,
                "best_peer": best.contestant,
                "ratio": ratio,
                "e2e_p99_no_worse": (ours.e2e_p99_s or 0) <= (best.e2e_p99_s or 0),
                "errors": ours.errors,
                "best_single": best_single.contestant if best_single else None,
                "ratio_single": (
                    ours.mean_request_tok_s / best_single.mean_request_tok_s
                    if best_single and best_single.mean_request_tok_s
                    else None
                ),
                "peers_missing": missing,
                "holds": bool(
                    ratio
                    and ratio >= 1.2
                    and (ours.e2e_p99_s or 0) <= (best.e2e_p99_s or 0)
                    and ours.errors == 0
                    and not missing
                ),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.routers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--output", default=None, help="directory for the runs' logs and loadgen outputs (default: a temp dir)"
    )
    ap.add_argument("--json", default="bench/routers/bench-routers.json", help="where the results go")
    ap.add_argument("--time-scale", type=float, default=0.5, help="twins' --time-scale (default 0.5)")
    ap.add_argument("--rate", type=float, default=6.0, help="open loop: requests per simulated second (default 6)")
    ap.add_argument("--quick", action="store_true", help="half the requests, one LiteLLM strategy")
    ap.add_argument("--only", default="", help="comma-separated substrings: run only matching contestants")
    ap.add_argument("--no-install", action="store_true", help="do not create the peers' venvs (fail if missing)")
    args = ap.parse_args(argv)
    args.output = args.output or tempfile.mkdtemp(prefix="bench-routers-")
    if not args.no_install:
        peers.ensure_venvs()
    print(HEADER, flush=True)
    results = run(args)
    verdict = verdicts(results)
    print()
    for v in verdict:
        print(
            f"{v['workload']:11s} specroute / best peer ({v['best_peer']}): {_f(v['ratio'], 2)}x mean request "
            f"tok/s, e2e p99 {'no worse' if v['e2e_p99_no_worse'] else 'WORSE'}, {v['errors']} errors; "
            f"/ best single ({v['best_single']}): {_f(v['ratio_single'], 2)}x -> "
            f"{'HOLDS' if v['holds'] else 'does not hold'} (target 1.2x)"
            + (f"; NOT COMPARED with {', '.join(v['peers_missing'])} (served nothing)" if v["peers_missing"] else "")
        )
    path = Path(args.json)
    path.write_text(
        json.dumps(
            {
                "time_scale": args.time_scale,
                "rate": args.rate,
                "slo": {"ttft_s": SLO_TTFT_S, "tpot_s": SLO_TPOT_S},
                "results": [r.__dict__ for r in results],
                "verdicts": verdict,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return 0
