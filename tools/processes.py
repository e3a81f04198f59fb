"""Server processes started on this machine, by the tools, loadgen, bench, the deploy scripts and the
tests: twins, gateways, peers, test servers. One free port, one way to start a child, one wait
until it is ready, one way to stop it.

Every child runs in its own session (one signal reaches anything it starts in turn) and gets
PR_SET_PDEATHSIG, so that the kernel sends it SIGTERM when the thread that started it dies, even by
SIGKILL. `stop`, `ProcessGroup.stop_all` and leaving a `ProcessGroup` terminate its whole process
group (SIGTERM, then SIGKILL): no orphan servers holding ports. Start children from the main
thread: PR_SET_PDEATHSIG follows the thread that forked, not the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import msgspec

from common.admin_api import decode_admin_backends

__all__ = [
    "ProcessError",
    "ProcessGroup",
    "console_script",
    "free_port",
    "http_get",
    "spawn",
    "specroute_cmd",
    "stop",
    "wait_backends_healthy",
    "wait_measured",
    "wait_ready",
]

_PR_SET_PDEATHSIG = 1


class ProcessError(RuntimeError):
    """A child could not be started or did not get ready; the message is one line for the user."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice): for a child to bind next."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # an AF_INET address: (host, port); typed Any
        return port


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


def _before_exec(parent: int, cpu: int | None) -> None:
    """preexec_fn: SIGTERM from the kernel when the parent dies; if it already died between fork
    and prctl, leave at once. `cpu`: run on that CPU only."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def spawn(
    cmd: Sequence[str],
    *,
    log_file: Path | None = None,
    quiet: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    cpu: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start a child in its own session with PR_SET_PDEATHSIG. Its output is appended to
    `log_file`, else dropped when `quiet`, else goes to our terminal. `env`: its whole environment
    (default: ours); `cpu`: pin it to that CPU."""
    parent = os.getpid()
    log: IO[bytes] | None = open(log_file, "ab") if log_file is not None else None  # noqa: SIM115 (closed below)
    out: int | IO[bytes] | None = log if log is not None else subprocess.DEVNULL if quiet else None
    try:
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else out,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=lambda: _before_exec(parent, cpu),
        )
    except OSError as e:
        raise ProcessError(f"cannot start {cmd[0]}: {e.strerror or e}") from None
    finally:
        if log is not None:
            log.close()  # the child holds its own copy of the descriptor


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM to the child's process group, SIGKILL after `timeout_s`; then whatever it left in
    its group (it had its own session) is killed too."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
    _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _last_line(log_file: Path | None) -> str:
    """The last line a child wrote, for an error message: ': LINE (log: PATH)', or ''."""
    if log_file is None or not log_file.exists():
        return ""
    lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
    return f": {lines[-1].strip()[:300]} (log: {log_file})" if lines else f" (log: {log_file}, empty)"


def wait_ready(
    url: str,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 60.0,
    name: str | None = None,
    log_file: Path | None = None,
) -> None:
    """Poll `url` until it answers 200. Raises ProcessError when `proc` exits first or when time runs
    out; the message names the child and ends with the last line of its log."""
    name = name or url
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise ProcessError(f"{name} exited with code {proc.returncode} during start-up{_last_line(log_file)}")
        if http_get(url) is not None:
            return
        if time.monotonic() > deadline:
            raise ProcessError(f"not ready after {timeout_s:.0f}s: {name}{_last_line(log_file)}")
        time.sleep(0.05)


class ProcessGroup:
    """Named children started together and stopped together; a context manager that always stops
    them. With `log_dir`, each child's output goes to `log_dir/NAME.log`."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.log_dir = log_dir

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        quiet: bool = True,
        log_file: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        cpu: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a child (`spawn`); its output goes to `log_file`, or the group's log_dir, or nowhere
        when `quiet`, else to our terminal."""
        if log_file is None and self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = self.log_dir / f"{name}.log"
        proc = spawn(cmd, log_file=log_file, quiet=quiet, env=env, cwd=cwd, cpu=cpu)
        self.procs[name] = proc
        if log_file is not None:
            self.logs[name] = log_file
        return proc

    def wait_ready(self, urls: Mapping[str, str], timeout_s: float = 60.0) -> None:
        """`wait_ready` for each `name -> url`, within one deadline."""
        deadline = time.monotonic() + timeout_s
        for name, url in urls.items():
            wait_ready(
                url,
                proc=self.procs.get(name),
                timeout_s=max(0.0, deadline - time.monotonic()),
                name=name,
                log_file=self.logs.get(name),
            )

    def check_alive(self) -> list[str]:
        """Names of the children that have exited."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self, name: str, timeout_s: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop(proc, timeout_s)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to every child's group at once, then each is waited for (SIGKILL at the deadline)."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            stop(proc, max(0.1, deadline - time.monotonic()))

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def console_script(name: str) -> str:
    """A console script of this installation (next to the interpreter), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    raise ProcessError(f"the '{name}' command is not installed next to {sys.executable} (install the project)")


def specroute_cmd(*args: str) -> list[str]:
    """Run the `specroute` command with this interpreter: works without the console script on PATH."""
    return [sys.executable, "-m", "tools.cli", *args]


def wait_backends_healthy(gateway_url: str, timeout_s: float = 30.0) -> bool:
    """Until the gateway's GET /admin/backends reports every backend up after a readiness check,
    with its /server_info read; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = http_get(gateway_url + "/admin/backends")
        if body is not None:
            with contextlib.suppress(msgspec.DecodeError):  # also a ValidationError: not our gateway (yet)
                if decode_admin_backends(body).all_serving(with_server_info=True):
                    return True
        time.sleep(0.1)
    return False


def wait_measured(gateway_url: str, timeout_s: float = 60.0) -> bool:
    """Until the gateway has measured its backends at start-up (gateway/seeding.py: only pools of
    mixed strategies are), so that load started next does not share them with the measurement's
    requests, as traffic after a deploy would not; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = http_get(gateway_url + "/admin/backends", timeout=5.0)
        with contextlib.suppress(msgspec.DecodeError):  # also a ValidationError: not our gateway (yet)
            state = decode_admin_backends(body) if body is not None else None
            if state is not None and all(
                b.get("observed", 0) >= 1
                for p in state.policies.values()
                if len({s.get("strategy") for s in p.get("backends", {}).values()}) > 1
                for b in p.get("backends", {}).values()
            ):
                return True
        time.sleep(0.2)
    return False
