"""The floors pyproject.toml declares are the versions `make floors` tests.

`requirements-floors.lock` is resolved with `--resolution lowest-direct`: each direct dependency at
the lowest version that fits everything else. When another package needs more than a declared
floor (check-jsonschema and kubernetes-validate need jsonschema 4.24), or the floor's release does
not exist, the lock holds a higher version than the floor says, and the floor promises a version
nothing has run on. Every direct dependency of the core, `tools` and `dev` sets (the floors lock's
scope) must sit in the lock at exactly its floor.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support import REPO


def _floors_lock() -> dict[str, Version]:
    text = (REPO / "requirements-floors.lock").read_text()
    return {
        canonicalize_name(m["name"]): Version(m["version"])
        for m in re.finditer(r"^(?P<name>[A-Za-z0-9_.-]+)==(?P<version>\S+)", text, re.MULTILINE)
    }


def _direct() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = [*project["dependencies"], *extras["tools"], *extras["dev"]]
    return [r for r in map(Requirement, names) if canonicalize_name(r.name) != "specroute"]


def test_every_floor_is_the_version_the_floors_lock_tests() -> None:
    locked = _floors_lock()
    mismatched = []
    for req in _direct():
        floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
        assert floors, f"{req}: no floor (>=) or pin (==)"
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in requirements-floors.lock: run make lock"
        if locked[name] != max(floors):
            mismatched.append(f"{req.name}: floor {max(floors)}, floors lock {locked[name]}")
    assert mismatched == []


def test_the_check_sees_a_floor_below_the_lock() -> None:
    """The comparison is by version, not text: 6 is 6.0, 4.18 is not 4.24."""
    assert Version("6") == Version("6.0") and Version("4.18") != Version("4.24")
