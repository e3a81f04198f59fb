"""The servers a study starts for itself: twins (`specroute sim`) and a gateway over them.

loadgen imports nothing from the other packages: it runs the `specroute` console script that sits
next to its own interpreter, as subprocesses, and talks to them over HTTP only.

No child may outlive the study. Each child gets its own process group (so one signal reaches
anything it spawned) and PR_SET_PDEATHSIG (the kernel sends it SIGTERM when loadgen dies, even
by SIGKILL). `Children.stop_all` runs on normal exit, on failure and on Ctrl-C / SIGTERM (the
study turns SIGTERM into KeyboardInterrupt): SIGTERM to every group, SIGKILL after a grace time.
Child output goes to `DIR/logs/NAME.log`; a child that dies during start-up is reported with the
tail of its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, NamedTuple

import msgspec

from common.admin_api import decode_admin_backends

_PR_SET_PDEATHSIG = 1


class ChildError(Exception):
    """A child server could not be started; the message is one line for the user."""


class Profile(NamedTuple):
    name: str
    strategy: str
    model: str
    description: str


def specroute_script() -> str:
    """The `specroute` console script installed with this interpreter."""
    here = Path(sys.executable).parent / "specroute"
    if here.exists():
        return str(here)
    found = shutil.which("specroute")
    if found:
        return found
    raise ChildError(
        f"the 'specroute' command is not installed next to {sys.executable} "
        "(install the project, or point the study at servers with --target)"
    )


def list_profiles(script: str) -> dict[str, Profile]:
    """`specroute sim --list`: name, strategy, served model, description per line."""
    try:
        p = subprocess.run([script, "sim", "--list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ChildError(f"'{script} sim --list' failed: {e}") from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ChildError(f"'{script} sim --list' exited with {p.returncode}: {tail[0]}")
    out: dict[str, Profile] = {}
    for line in p.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3:
            out[parts[0]] = Profile(parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else "")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent: int) -> None:
    """preexec_fn: ask the kernel for SIGTERM when the parent dies; if it already died between
    fork and prctl, leave at once."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


class _Child(NamedTuple):
    name: str
    proc: subprocess.Popen
    log: Path | None


class Children:
    """The child servers of one study; a context manager that always stops them."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.log_dir = log_dir
        self._children: dict[str, _Child] = {}

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, name: str, cmd: Sequence[str]) -> None:
        log: Path | None = None
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.log_dir / f"{name}.log"
            out = log.open("wb")
        parent = os.getpid()
        try:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _die_with_parent(parent),
            )
        except OSError as e:
            raise ChildError(f"cannot start {name} ({cmd[0]}): {e.strerror or e}") from None
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own descriptor
        self._children[name] = _Child(name, proc, log)

    def wait_ready(self, urls: dict[str, str], timeout: float = 60.0) -> None:
        """Poll `name -> url` until each answers 200; a dead child or the timeout raises."""
        deadline = time.monotonic() + timeout
        pending = dict(urls)
        while pending:
            for name, url in list(pending.items()):
                child = self._children[name]
                code = child.proc.poll()
                if code is not None:
                    raise ChildError(f"{name} exited with code {code} during start-up{self._tail(child)}")
                if _get(url) is not None:
                    del pending[name]
            if pending:
                if time.monotonic() > deadline:
                    raise ChildError(
                        f"not ready after {timeout:.0f}s: {', '.join(pending)}"
                        f"{self._tail(self._children[next(iter(pending))])}"
                    )
                time.sleep(0.1)

    def check_alive(self) -> list[str]:
        """Names of children that have exited."""
        return [n for n, c in self._children.items() if c.proc.poll() is not None]

    def stop_all(self, grace: float = 10.0) -> None:
        children = list(self._children.values())
        self._children.clear()
        for c in children:
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in children:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(5)
            # anything the child left in its group (it had its own session)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)

    @staticmethod
    def _tail(child: _Child) -> str:
        if child.log is None or not child.log.exists():
            return ""
        lines = [ln for ln in child.log.read_text(errors="replace").splitlines() if ln.strip()]
        return f": {lines[-1].strip()[:300]} (log: {child.log})" if lines else ""


def _get(url: str, timeout: float = 2.0) -> bytes | None:
    """Body of a 200 answer, None for anything else."""
    with (
        contextlib.suppress(urllib.error.URLError, OSError, ValueError),
        urllib.request.urlopen(url, timeout=timeout) as r,
    ):
        if r.status == 200:
            return r.read()
    return None


def gateway_config(listen: str, backends: Sequence[tuple[str, str, Profile]], policy: str | None = None) -> str:
    """TOML of a gateway over `(name, url, profile)` backends (README "Configuration")."""
    lines = [
        "# written by `loadgen study`: a gateway over the twins it started",
        "[gateway]",
        f"listen = {json.dumps(listen)}",
    ]
    if policy:
        lines.append(f"policy = {json.dumps(policy)}")
    for name, url, prof in backends:
        lines += [
            "",
            "[[backends]]",
            f"name = {json.dumps(name)}",
            f"url = {json.dumps(url)}",
            f"model = {json.dumps(prof.model)}",
            f"strategy = {json.dumps(prof.strategy)}",
        ]
    return "\n".join(lines) + "\n"


def wait_backends_healthy(gateway_url: str, timeout: float = 30.0) -> bool:
    """Wait until the gateway's GET /admin/backends reports every backend up after a readiness
    check, with its /server_info read; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = _get(gateway_url + "/admin/backends")
        if body is not None:
            with contextlib.suppress(msgspec.DecodeError):  # also a ValidationError: not our gateway (yet)
                if decode_admin_backends(body).all_serving(with_server_info=True):
                    return True
        time.sleep(0.2)
    return False


class Topology(NamedTuple):
    urls: dict[str, str]  # study target -> base URL
    gateway_url: str | None


def start_topology(
    children: Children,
    targets: Sequence[str],
    *,
    time_scale: float,
    seed: int,
    policy: str | None,
    config_dir: Path,
    ready_timeout: float = 90.0,
) -> Topology:
    """Start a twin per profile of `targets`, then (if "gateway" is among them) a gateway over
    those twins with a config file written into `config_dir`; wait until all are ready."""
    script = specroute_script()
    profiles = list_profiles(script)
    twins = [t for t in targets if t != "gateway"]
    unknown = [t for t in twins if t not in profiles]
    if unknown:
        raise ChildError(
            f"twin profile(s) {', '.join(unknown)} unknown to '{script} sim --list'"
            f" (known: {', '.join(sorted(profiles)) or 'none'})"
        )
    urls: dict[str, str] = {}
    for name in twins:
        port = free_port()
        cmd = [script, "sim", "--profile", name, "--host", "127.0.0.1", "--port", str(port), "--seed", str(seed)]
        if time_scale != 1.0:
            cmd += ["--time-scale", repr(time_scale)]
        children.start(name, cmd)
        urls[name] = f"http://127.0.0.1:{port}"
    children.wait_ready({n: u + "/ready" for n, u in urls.items()}, ready_timeout)
    if "gateway" not in targets:
        return Topology(urls, None)
    port = free_port()
    config_dir.mkdir(parents=True, exist_ok=True)
    config = config_dir / "gateway.toml"
    config.write_text(gateway_config(f"127.0.0.1:{port}", [(n, urls[n], profiles[n]) for n in twins], policy))
    children.start("gateway", [script, "serve", "--config", str(config)])
    gw = f"http://127.0.0.1:{port}"
    children.wait_ready({"gateway": gw + "/health"}, ready_timeout)
    if not wait_backends_healthy(gw):
        print("loadgen: warning: the gateway does not report all backends healthy yet", file=sys.stderr)
    urls["gateway"] = gw
    return Topology(urls, gw)
