"""Helpers for tests that run real processes on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from tools.processes import free_port, spawn, stop, wait_ready

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# The first 400 lines of Kimi's Mooncake conversation trace (its attribution: beside the file).
TRACE_SLICE = REPO / "loadgen/data/traces/mooncake_conversation_head400.jsonl"


def mooncake_trace(path: Path, rows: Sequence[tuple[int, int, int, list[int]]]) -> Path:
    """Write a Mooncake trace of (timestamp ms, input_length, output_length, hash_ids) rows."""
    import json

    path.write_text(
        "".join(
            json.dumps({"timestamp": ts, "input_length": n, "output_length": o, "hash_ids": ids}) + "\n"
            for ts, n, o, ids in rows
        )
    )
    return path


# The twin profiles every release ships: the sim's tests expect each of them in its listings.
SIM_PROFILES = frozenset(
    {
        "k26-ar",
        "k26-eagle3",
        "k26-dflash",
        "k26-ddtree",
        "k26-ngram",
        "qwen36-ar",
        "qwen36-ddtree-b15",
        "qwen36-ddtree-b64",
        "zero",  # the zero-delay profile the benchmarks use
    }
)


@contextlib.contextmanager
def running(
    cmd: Sequence[str], ready_url: str | None = None, timeout: float = 30.0, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """Run `cmd` (tools/processes.py `spawn`: its own process group, dies with us); wait for
    `ready_url`; stop the whole group afterwards. Its output goes to a file, never an undrained
    pipe: a full pipe would block the child's writes."""
    with tempfile.TemporaryDirectory(prefix="specroute-test-") as tmp:
        log = Path(tmp) / "output.log"
        proc = spawn(cmd, log_file=log, env={**os.environ, **(env or {})}, cwd=REPO)
        proc.log = log  # type: ignore[attr-defined]
        try:
            if ready_url:
                try:
                    wait_ready(ready_url, proc=proc, timeout_s=timeout)
                except Exception as e:
                    stop(proc)
                    raise RuntimeError(f"{' '.join(cmd)} failed to start:\n{output(proc)[-4000:]}") from e
            yield proc
        finally:
            stop(proc)


def output(proc: subprocess.Popen) -> str:
    """What a process started by `running` has printed so far."""
    log: Path = proc.log  # type: ignore[attr-defined]
    return log.read_text(errors="replace") if log.exists() else ""


def specroute(*args: str) -> list[str]:
    return [str(BIN / "specroute"), *args]


def loadgen(*args: str) -> list[str]:
    return [str(BIN / "loadgen"), *args]


class Clock:
    """A fake clock for what takes one (`clock=`): it reads `now`, which the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gateway_config(port: int, backends: list[dict], extra: str = "", gateway_keys: str = "") -> str:
    """TOML for a gateway on `port` with `backends` ({name, url, model, strategy}); `extra` appended,
    `gateway_keys` added to the [gateway] table."""
    lines = [f'[gateway]\nlisten = "127.0.0.1:{port}"\n{gateway_keys}']
    for b in backends:
        lines.append("[[backends]]\n" + "".join(f'{k} = "{v}"\n' for k, v in b.items()))
    return "\n".join(lines) + "\n" + extra


@contextlib.contextmanager
def gateway(
    tmp_path: Path, backends: list[dict], extra: str = "", env: dict[str, str] | None = None, gateway_keys: str = ""
) -> Iterator[str]:
    """`specroute serve --config` over `backends`; yields its base URL."""
    port = free_port()
    path = tmp_path / f"gateway-{port}.toml"
    path.write_text(gateway_config(port, backends, extra, gateway_keys))
    with running(specroute("serve", "--config", str(path)), ready_url=f"http://127.0.0.1:{port}/health", env=env):
        yield f"http://127.0.0.1:{port}"


def get_json(url: str, headers: dict[str, str] | None = None) -> dict:
    import json

    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until true; the test then asserts on the state, not on elapsed time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@contextlib.contextmanager
def open_stream(base_url: str, body: dict, events: int = 3) -> Iterator[socket.socket]:
    """POST a streaming chat request on a raw socket and read `events` SSE events; leaving the
    block closes the connection mid-stream (a client that goes away)."""
    import json

    raw = json.dumps(body).encode()
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
        )
        received = b""
        while received.count(b"data: ") < events:
            received += sock.recv(65536)
        yield sock


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """An aiohttp `app` served on a free loopback port inside the running loop; yields its base URL."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def one_slot_gateway(
    tmp: Path, time_scale: str, queue_timeout_s: float = 60.0
) -> Iterator[tuple[str, str, subprocess.Popen]]:
    """A k26-ar twin behind `specroute serve` admitting one request at a time, so the next ones
    wait in its queue; yields (twin URL, gateway URL, the gateway's process)."""
    twin_port, port = free_port(), free_port()
    twin = f"http://127.0.0.1:{twin_port}"
    config = tmp / f"gateway-{port}.toml"
    backends = [{"name": "ar", "url": twin, "model": "kimi-k2.6", "strategy": "ar"}]
    config.write_text(
        gateway_config(
            port,
            backends,
            f"[admission]\nmax_inflight = 1\nqueue_timeout_s = {queue_timeout_s}\n"
            # clients may set any priority here: the queue's order is what these tests look at
            f"[auth]\npriority_range = [{-(1 << 63)}, {(1 << 63) - 1}]\n",
        )
    )
    with (
        running(
            specroute("sim", "--profile", "k26-ar", "--port", str(twin_port), "--time-scale", time_scale),
            ready_url=f"{twin}/ready",
            timeout=60,
        ),
        running(specroute("serve", "--config", str(config)), ready_url=f"http://127.0.0.1:{port}/health") as proc,
    ):
        yield twin, f"http://127.0.0.1:{port}", proc
