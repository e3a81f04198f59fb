"""`specroute backends launch`: check the host, then replace this process with the SGLang server.

The process is replaced (exec), not wrapped: signals from systemd, a container runtime or the
terminal reach SGLang directly, and its exit code is the command's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tools.launch.recipe import LaunchOptions, LaunchRecipe, command, environment

__all__ = ["LaunchError", "detect_gpus", "launch", "preflight"]


class LaunchError(Exception):
    """The host cannot run this recipe; the message is one line for the operator."""


def detect_gpus() -> list[int]:
    """Indices of the NVIDIA GPUs the driver exposes (nvidia-smi, else /proc/driver/nvidia)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
            )
            if out.returncode == 0:
                return [int(line) for line in out.stdout.split() if line.strip().isdigit()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    proc = Path("/proc/driver/nvidia/gpus")
    return list(range(len(list(proc.iterdir())))) if proc.is_dir() else []


def preflight(
    recipe: LaunchRecipe,
    options: LaunchOptions,
    *,
    find_spec: Callable[[str], object] = importlib.util.find_spec,
    gpus: Callable[[], list[int]] = detect_gpus,
) -> list[str]:
    """Raise LaunchError when the host cannot run the recipe; return warnings otherwise."""
    if find_spec("sglang") is None:
        raise LaunchError(
            f"SGLang is not installed in {sys.executable}: install the [sglang] extra on a GPU host "
            "(pip install 'specroute[sglang]')"
        )
    found = gpus()
    if not found:
        raise LaunchError(
            "no NVIDIA GPU found (nvidia-smi lists none): `backends launch` runs on a GPU host; "
            "use `specroute backends show` to print the command"
        )
    wanted = list(options.gpus) if options.gpus is not None else list(range(recipe.gpus))
    if len(wanted) != recipe.gpus:
        raise LaunchError(f"{recipe.name} needs {recipe.gpus} GPU(s), --gpus names {len(wanted)}")
    missing = [g for g in wanted if g not in found]
    if missing:
        raise LaunchError(
            f"{recipe.name} needs GPUs {','.join(map(str, wanted))} but this host has "
            f"{len(found)} ({','.join(map(str, found))})"
        )
    warnings = []
    if options.trace and find_spec("opentelemetry") is None:
        warnings.append("tracing is on but OpenTelemetry is not installed: install sglang[tracing] or pass --no-trace")
    if recipe.build != "release":
        warnings.append(
            f"{recipe.name} needs an SGLang build with DDTree support; a release build refuses "
            "--speculative-algorithm DDTREE"
        )
    return warnings


def launch(
    recipe: LaunchRecipe,
    options: LaunchOptions,
    *,
    execve: Callable[[str, list[str], dict[str, str]], object] = os.execve,
    find_spec: Callable[[str], object] = importlib.util.find_spec,
    gpus: Callable[[], list[int]] = detect_gpus,
) -> None:
    """Check the host and exec the server with this interpreter (the one that has SGLang)."""
    for warning in preflight(recipe, options, find_spec=find_spec, gpus=gpus):
        print(f"specroute backends launch: warning: {warning}", file=sys.stderr)
    python = sys.executable
    argv = command(recipe, dataclasses.replace(options, python=python))
    env = {**os.environ, **environment(recipe, options)}
    print("+ " + " ".join(argv), file=sys.stderr, flush=True)
    execve(python, argv, env)
