"""`--version` on the three commands: the installed package's version, which is pyproject's."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from common.version import package_version
from tests.support import BIN, REPO


def test_the_installed_version_is_pyprojects() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert package_version() == declared


@pytest.mark.parametrize("command", ["specroute", "specroute-gateway", "loadgen"])
def test_each_command_prints_its_name_and_the_version(command: str) -> None:
    proc = subprocess.run([str(BIN / command), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{command} {package_version()}"
