"""What a test may start: the guard of tests/unit, and the floors run's plugin.

- **tests/unit** (`make unit`): a unit test starts no process and opens no socket (no connect, no
  bind: no twin, no gateway, no CLI run, no server on loopback). `tests/unit/conftest.py` turns the
  guard on for each of its tests; one that tries either fails, naming what it tried, even where the
  attempt's error was caught or happened on another thread. Such a test belongs in
  tests/integration.
- **`pytest -p tests.unit_only`** (`make floors`): over the whole suite, a test (or the fixture it
  needs) that tries to start a child process is skipped at that moment, not by a list to keep up to
  date. What is left still serves on loopback inside the test process (an in-process uvicorn
  thread, an aiohttp test server), so the libraries whose versions matter (litestar, aiohttp,
  msgspec, tenacity, the OpenTelemetry SDK) are exercised on the lowest versions the declared
  floors allow (docs/dependencies.md).

Both work by one audit hook (PEP 578), installed when this module is first imported; an audit hook
cannot be removed, so both states are switches the hook reads.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Audit events raised before a child process (or a forked copy of this one) is created.
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec"})
# Audit events raised before a socket reaches out or listens (a socketpair, as asyncio's loop makes
# for itself, raises neither).
SOCKET_EVENTS = frozenset({"socket.connect", "socket.bind", "socket.sendto"})


class Guard:
    """The audit hook's state: strict while a unit test runs, skipping for a floors run."""

    def __init__(self) -> None:
        self.strict = False
        self.skip_processes = False
        self.tried: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.strict and (event in PROCESS_EVENTS or event in SOCKET_EVENTS):
            what = f"{event} {_describe(event, args)}"
            self.tried.append(what)
            pytest.fail(f"a unit test tried {what}: it belongs in tests/integration", pytrace=False)
        if self.skip_processes and event in PROCESS_EVENTS:
            pytest.skip(f"starts a process ({event}): not run on the floors")

    @contextlib.contextmanager
    def unit_test(self) -> Iterator[None]:
        """Strict for the duration; fails afterwards if anything was tried, even if it was caught."""
        self.strict, self.tried = True, []
        try:
            yield
        finally:
            self.strict = False
        if self.tried:
            pytest.fail(f"a unit test tried {', '.join(self.tried)}: it belongs in tests/integration", pytrace=False)


def _describe(event: str, args: tuple[Any, ...]) -> str:
    if event.startswith("socket.") and len(args) > 1:
        return repr(args[1])  # the address
    if event == "subprocess.Popen" and len(args) > 1:
        return repr(args[1])  # the command line
    return ""


GUARD = Guard()
sys.addaudithook(GUARD.audit)


def pytest_configure(config: pytest.Config) -> None:
    GUARD.skip_processes = True
