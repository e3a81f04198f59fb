"""Instructions per request in the gateway process, counted by valgrind's callgrind: a measure of
the gateway's own work that does not move with the machine's load, unlike time.

    python -m bench.instructions [--requests 2000] [--modes off,on,on10]

On a shared machine, throughput and CPU time move by a point or more from run to run, more than
many of the changes worth measuring (tracing costs a few percent). Instructions retired do not: two
runs of the same code agree within about 0.3%. They are not time (cache misses, the kernel, other
processes are not in them), so they complement `bench.gateway_bench`, they do not replace it.

How: the zero-delay backend (`bench.zero_server`, also the OTLP sink) runs normally; each gateway
(`specroute serve`, the same configuration as the benchmark's) runs under callgrind with
instrumentation off, takes 3,000 warm-up requests at 64 in flight, then `callgrind_control`
switches instrumentation on for `--requests` requests and dumps the counts. Only the gateway's own
process is counted (not its span exporter process). Modes: tracing off, on (every request traced),
on10 (10% sampled). Needs valgrind (`apt install valgrind`); about 25 s per mode.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

from bench.callgrind import total_instructions
from bench.gateway_bench import Target, _body, _gateway_toml, _process, run_level
from tools.processes import free_port

WARMUP_REQUESTS = 3000
CONCURRENCY = 64


def _gateway_env(mode: str, sink_port: int) -> dict[str, str]:
    if mode == "off":
        return {"OTEL_TRACES_EXPORTER": "none"}
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}", "OTEL_TRACES_EXPORTER": "otlp"}
    if mode == "on10":
        env.update({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"})
    return env


def count(
    mode: str, requests: int, backend_port: int, tmp: Path, cpus: tuple[int | None, int | None], stream: bool = False
) -> float:
    """Instructions per request of one gateway in `mode`."""
    port = free_port()
    config = tmp / f"gateway-{mode}.toml"
    config.write_text(_gateway_toml(port, backend_port))
    out_dir = tmp / f"callgrind-{mode}"
    out_dir.mkdir()
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_dir}/out.%p",
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
    ]
    # valgrind runs the start-up about 50x slower: a longer wait for /health than the benchmark's
    with _process(
        cmd,
        tmp / f"gateway-{mode}.log",
        cpus[1],
        _gateway_env(mode, backend_port),
        ready_url=f"http://127.0.0.1:{port}/health",
        ready_timeout_s=300.0,
    ) as proc:
        target = Target(mode, port, None)
        body = _body(stream)
        uvloop.run(run_level(target, body, CONCURRENCY, requests=WARMUP_REQUESTS))
        subprocess.run(["callgrind_control", "--instr=on", str(proc.pid)], check=True, capture_output=True)
        result = uvloop.run(run_level(target, body, CONCURRENCY, requests=requests))
        subprocess.run(["callgrind_control", "--dump", str(proc.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "--instr=off", str(proc.pid)], check=True, capture_output=True)
    if result["errors"]:
        raise RuntimeError(f"{mode}: {result['errors']} requests failed")
    dumps = [p for p in out_dir.iterdir() if p.stat().st_size]
    return max(total_instructions(p) for p in dumps) / result["n"]  # the dump holds the counted part


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="counted requests per mode")
    p.add_argument("--modes", default="off,on,on10", help="comma-separated: off, on, on10")
    p.add_argument("--stream", action="store_true", help="streaming requests (64 chunks) instead of complete ones")
    a = p.parse_args(argv)
    modes = a.modes.split(",")
    if unknown := set(modes) - {"off", "on", "on10"}:
        p.error(f"unknown modes: {sorted(unknown)}")
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("bench.instructions needs valgrind (e.g. `apt install valgrind`)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        backend_port = free_port()
        # as in the benchmark: backend and load client on CPU 0, the gateway on CPU 1 (when there are two)
        cpus = (0, 1) if (os.cpu_count() or 1) >= 2 else (None, None)
        if cpus[0] is not None:
            os.sched_setaffinity(0, {cpus[0]})
        stack.enter_context(
            _process(
                [sys.executable, "-m", "bench.zero_server", "--port", str(backend_port)],
                tmp / "backend.log",
                cpus[0],
                ready_url=f"http://127.0.0.1:{backend_port}/health",
            )
        )
        per_request = {}
        for mode in modes:
            per_request[mode] = count(mode, a.requests, backend_port, tmp, cpus, a.stream)
            print(f"{mode:5s} {per_request[mode]:12,.0f} instructions per request", flush=True)
    if "off" in per_request:
        for mode, n in per_request.items():
            if mode != "off":
                extra = n - per_request["off"]
                print(f"{mode:5s} over off: {extra:+,.0f} instructions per request ({extra / per_request['off']:+.2%})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
