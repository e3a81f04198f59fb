"""Every `make TARGET` the README and docs/ name is a target of the Makefile (a dry run finds it)."""

import re
import shutil
import subprocess

import pytest

from tests.support import REPO


def _documented_targets() -> set[str]:
    targets: set[str] = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        targets.update(re.findall(r"`make ([a-z][a-z-]*)`", text))
        for line in re.findall(r"^make (.+)$", text, re.M):  # the README's `make a | b | c` line
            targets.update(t.strip() for t in line.split("|") if re.fullmatch(r"[a-z][a-z-]*", t.strip()))
    return targets


def test_the_docs_name_make_targets() -> None:
    assert {"demo", "test", "lint", "bench", "bench-routers"} <= _documented_targets()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
@pytest.mark.parametrize("target", sorted(_documented_targets()))
def test_documented_make_target_exists(target: str) -> None:
    dry = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "No rule to make target" not in dry.stderr, dry.stderr
