"""Peak memory of the gateway under large request bodies (issue 36's target: six concurrent 30 MB
bodies raise the gateway's peak RSS by less than 1 GB).

    python -m bench.body_memory [--bodies 6] [--mb 30] [--shapes text,messages,ids]

For each body shape, a fresh `specroute serve` in front of the zero-delay backend
(`bench.zero_server`) takes `--bodies` concurrent POSTs of `--mb` MB each, and the growth of its
peak resident set (VmHWM in /proc, over its idle RSS) is printed beside the target. Shapes:
`text`, one message of that many characters; `messages`, many small messages (the cheapest
JSON per decoded object: a full decode into dicts costs its size many times over); `ids`, a
completions prompt of token ids. Every answer is checked: served (200) or refused for the body
budget (503), never a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import aiohttp

from bench.gateway_bench import _process
from tools.processes import free_port

TARGET_MIB = 1024


def _body(shape: str, size: int) -> tuple[str, bytes]:
    if shape == "text":
        body = {"model": "bench-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * size}]}
        return "/v1/chat/completions", json.dumps(body).encode()
    if shape == "messages":
        one = '{"role":"user","content":"hi"},'
        count = size // len(one)
        raw = '{"model":"bench-model","max_tokens":4,"messages":[' + (one * count)[:-1] + "]}"
        return "/v1/chat/completions", raw.encode()
    if shape == "ids":
        count = size // 6
        raw = '{"model":"bench-model","max_tokens":4,"prompt":[' + ",".join(["12345"] * count) + "]}"
        return "/v1/completions", raw.encode()
    raise ValueError(shape)


def _status(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _send(port: int, path: str, body: bytes, n: int) -> list[int]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as s:

        async def one() -> int:
            async with s.post(
                f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                await r.read()
                return r.status

        return list(await asyncio.gather(*(one() for _ in range(n))))


def measure(shape: str, bodies: int, mb: int, tmp: Path) -> tuple[float, float, list[int]]:
    """(idle RSS, peak growth, statuses) in MiB."""
    bport, gport = free_port(), free_port()
    config = tmp / f"gateway-{shape}.toml"
    config.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{gport}"\npolicy = "round_robin"\n'
        f'[[backends]]\nname = "zero"\nurl = "http://127.0.0.1:{bport}"\nmodel = "bench-model"\n'
    )
    path, body = _body(shape, mb * 1_000_000)
    with (
        _process(
            [sys.executable, "-m", "bench.zero_server", "--port", str(bport)],
            tmp / "zero.log",
            None,
            ready_url=f"http://127.0.0.1:{bport}/health",
        ),
        _process(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
            tmp / f"gw-{shape}.log",
            None,
            env={"OTEL_TRACES_EXPORTER": "none"},
            ready_url=f"http://127.0.0.1:{gport}/health",
        ) as gw,
    ):
        idle = _status(gw.pid, "VmRSS")
        before = _status(gw.pid, "VmHWM")
        statuses = asyncio.run(_send(gport, path, body, bodies))
        peak = _status(gw.pid, "VmHWM")
    return idle, peak - max(before, idle), statuses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bodies", type=int, default=6)
    p.add_argument("--mb", type=int, default=30)
    p.add_argument("--shapes", default="text,messages,ids")
    args = p.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            idle, growth, statuses = measure(shape, args.bodies, args.mb, Path(tmp))
            served, refused = statuses.count(200), statuses.count(503)
            met = growth < TARGET_MIB and served + refused == len(statuses) and served > 0
            ok = ok and met
            print(
                f"{shape:<9} {args.bodies} x {args.mb} MB: idle RSS {idle:6.1f} MiB, peak +{growth:7.1f} MiB "
                f"(target < {TARGET_MIB}), served {served}, refused 503 {refused}  {'ok' if met else 'MISSED'}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
