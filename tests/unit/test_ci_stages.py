"""CI runs what `make test` runs: the same stages in the same order, and the test stages together
cover every test file (a test file outside tests/unit, tests/integration and tests/deploy would run
in no stage)."""

from __future__ import annotations

import re
import tomllib

from tests.support import REPO

TEST_FOLDERS = ["tests/unit", "tests/integration", "tests/deploy"]


def _makefile() -> str:
    return (REPO / "Makefile").read_text()


def _make_stages() -> list[str]:
    match = re.search(r"^TEST_STAGES\s*:=\s*(.+)$", _makefile(), re.M)
    assert match, "Makefile: no TEST_STAGES"
    return match.group(1).split()


def _recipe(target: str) -> str:
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", _makefile(), re.M)
    assert match, f"Makefile: no target {target}"
    return match.group(1)


def test_ci_runs_the_stages_of_make_test_in_order() -> None:
    match = re.search(r"^stages=\(([^)]*)\)", (REPO / ".ci/run").read_text(), re.M)
    assert match, ".ci/run: no stages=(...)"
    assert match.group(1).split() == _make_stages()
    assert "$(TEST_STAGES)" in _recipe("test")


def test_the_test_stages_cover_every_test_file() -> None:
    stages = _make_stages()
    assert stages[0] == "lint" and "floors" in stages
    folders = [folder for stage in stages for folder in re.findall(r"\btests/[a-z_]+", _recipe(stage))]
    assert folders == TEST_FOLDERS
    outside = [
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if not any(path.is_relative_to(REPO / folder) for folder in TEST_FOLDERS)
    ]
    assert outside == []


def test_a_plain_pytest_run_collects_the_same_folders() -> None:
    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert pytest_ini["testpaths"] == TEST_FOLDERS
