"""pytest plugin for the unit-test run: `pytest -p tests.unit_only`.

A unit test here is one that starts no child process: no twin, no gateway, no CLI run. It may still
serve on loopback inside the test process (an in-process uvicorn thread, an aiohttp test server),
so the libraries whose versions matter (litestar, aiohttp, msgspec, tenacity, the OpenTelemetry SDK)
are exercised. The rule is applied as tests run, not by a list to keep up to date: a test (or the
fixture it needs) that tries to start a process is skipped at that moment.

`make test` runs the unit tests once more in a second environment holding the lowest versions the
declared dependency floors allow (docs/dependencies.md): this is how the floors are known to work.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

# Audit events raised before a child process (or a forked copy of this one) is created.
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec"})


def _refuse_processes(event: str, _args: tuple[Any, ...]) -> None:
    if event in _PROCESS_EVENTS:
        pytest.skip(f"starts a process ({event}): not a unit test")


def pytest_configure(config: pytest.Config) -> None:
    # An audit hook (PEP 578) cannot be removed: this plugin is for a whole run, never for part of one.
    sys.addaudithook(_refuse_processes)
