"""The servers a study starts for itself: twins (`specroute sim`) and a gateway over them.

loadgen runs the `specroute` console script that sits next to its own interpreter, as
subprocesses, and talks to them over HTTP only; it starts and stops them with the tools' process
helpers (tools/processes.py).

No child may outlive the study. Each child gets its own process group and PR_SET_PDEATHSIG (the
kernel sends it SIGTERM when loadgen dies, even by SIGKILL). The group of children stops them all
on normal exit, on failure and on Ctrl-C / SIGTERM (the study turns SIGTERM into
KeyboardInterrupt): SIGTERM to every group, SIGKILL after a grace time. Child output goes to
`DIR/logs/NAME.log`; a child that dies during start-up is reported with the tail of its log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from tools.processes import ProcessError, ProcessGroup, console_script, free_port, wait_backends_healthy


class Profile(NamedTuple):
    name: str
    strategy: str
    model: str
    description: str


def list_profiles(script: str) -> dict[str, Profile]:
    """`specroute sim --list`: name, strategy, served model, description per line."""
    try:
        p = subprocess.run([script, "sim", "--list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProcessError(f"'{script} sim --list' failed: {e}") from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ProcessError(f"'{script} sim --list' exited with {p.returncode}: {tail[0]}")
    out: dict[str, Profile] = {}
    for line in p.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3:
            out[parts[0]] = Profile(parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else "")
    return out


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


class Topology(NamedTuple):
    urls: dict[str, str]  # study target -> base URL
    gateway_url: str | None


def start_topology(
    children: ProcessGroup,
    targets: Sequence[str],
    *,
    time_scale: float,
    seed: int,
    policy: str | None,
    config_dir: Path,
    ready_timeout: float = 90.0,
    twin_flags: Sequence[str] = (),
) -> Topology:
    """Start a twin per profile of `targets` (each with `twin_flags` besides its profile), then (if
    "gateway" is among them) a gateway over those twins with a config file written into
    `config_dir`; wait until all are ready."""
    script = console_script("specroute")
    profiles = list_profiles(script)
    twins = [t for t in targets if t != "gateway"]
    unknown = [t for t in twins if t not in profiles]
    if unknown:
        raise ProcessError(
            f"twin profile(s) {', '.join(unknown)} unknown to '{script} sim --list'"
            f" (known: {', '.join(sorted(profiles)) or 'none'})"
        )
    urls: dict[str, str] = {}
    for name in twins:
        port = free_port()
        cmd = [script, "sim", "--profile", name, "--host", "127.0.0.1", "--port", str(port), "--seed", str(seed)]
        if time_scale != 1.0:
            cmd += ["--time-scale", repr(time_scale)]
        children.start(name, [*cmd, *twin_flags])
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
