"""The product stands alone: what `specroute-gateway` does by itself, and what `specroute serve`
hands it."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import BIN, specroute


@pytest.mark.parametrize(
    "cmd",
    [specroute("serve"), [str(BIN / "specroute-gateway"), "serve"], specroute("serve", "--listen", "127.0.0.1:1")],
)
def test_serve_without_backends_refuses_naming_both_ways_on(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--config FILE" in lines[0] and "--twins" in lines[0]


def test_the_twins_flags_are_the_tools_not_the_products() -> None:
    gateway = subprocess.run([str(BIN / "specroute-gateway"), "serve", "--twins"], capture_output=True, text=True)
    assert gateway.returncode == 2 and "unrecognized arguments: --twins" in gateway.stderr
    both = subprocess.run(specroute("serve", "--twins", "--config", "x.toml"), capture_output=True, text=True)
    assert both.returncode == 2 and "not allowed with" in both.stderr
    scale = subprocess.run(specroute("serve", "--sim-time-scale", "0.1"), capture_output=True, text=True)
    assert scale.returncode == 2 and "--twins only" in scale.stderr
