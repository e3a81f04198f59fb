"""Server processes started on this machine: twins, gateways (the embedded topology, the demo,
the policy evaluator's HTTP check).

Every child gets PR_SET_PDEATHSIG so that it dies with its parent even on SIGKILL, and
`stop`/`stop_all` terminate it (SIGTERM, then SIGKILL): no orphan servers holding ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def http_get(url: str, timeout: float = 2.0) -> bytes | None:
    """Body of a 200 answer; None for any other status or no answer (not up yet, or gone)."""
    with (
        contextlib.suppress(urllib.error.URLError, OSError, ValueError),
        urllib.request.urlopen(url, timeout=timeout) as r,
    ):
        if r.status == 200:
            body: bytes = r.read()  # urlopen's answer is typed Any
            return body
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # an AF_INET address: (host, port); typed Any
        return port


def specroute_cmd(*args: str) -> list[str]:
    """Run our own CLI with this interpreter: works without the console script on PATH."""
    return [sys.executable, "-m", "tools.cli", *args]


_Sink = int | IO[bytes] | None  # what Popen accepts for stdout/stderr: a file, DEVNULL/STDOUT, or inherit


def _spawn(cmd: Sequence[str], *, stdout: _Sink, stderr: _Sink) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(cmd), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, preexec_fn=_die_with_parent
    )


class ProcessGroup:
    def __init__(self, log_dir: Path | None = None) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.log_dir = log_dir  # when set, each child's output goes to log_dir/NAME.log

    def start(
        self, name: str, cmd: Sequence[str], *, quiet: bool = True, log_file: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a child; its output goes to `log_file` (or the group's log_dir), or nowhere when
        `quiet`, else to our terminal."""
        if log_file is None and self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = self.log_dir / f"{name}.log"
        if log_file is not None:
            with open(log_file, "ab") as log:  # the child holds its own copy of the descriptor
                proc = _spawn(cmd, stdout=log, stderr=subprocess.STDOUT)
        else:
            sink = subprocess.DEVNULL if quiet else None
            proc = _spawn(cmd, stdout=sink, stderr=sink)
        self.procs[name] = proc
        return proc

    def wait_ready(self, urls: dict[str, str], timeout_s: float = 60.0) -> None:
        """Poll each `name -> url` until it answers 200; raise if a process died or time ran out."""
        deadline = time.monotonic() + timeout_s
        pending = dict(urls)
        while pending:
            for name, url in list(pending.items()):
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode} during start-up")
                if http_get(url) is not None:
                    del pending[name]
            if pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {timeout_s:.0f}s: {', '.join(pending)}")
                time.sleep(0.1)

    def stop(self, name: str, timeout_s: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        self.procs.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
