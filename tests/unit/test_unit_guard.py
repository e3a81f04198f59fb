"""The guard of tests/unit (tests/unit_only.py): a unit test that starts a process or opens a
socket fails, naming what it tried; the floors run skips a test that starts a process."""

from __future__ import annotations

import contextlib
import re
import socket

import pytest

from tests.unit_only import GUARD, Guard

ADDRESS = ("127.0.0.1", 9)


def test_the_guard_is_on_during_a_unit_test() -> None:
    assert GUARD.strict and GUARD.tried == []


@pytest.mark.parametrize(
    ("event", "args"),
    [
        ("subprocess.Popen", ("specroute", ["specroute", "sim"], None, None)),
        ("os.fork", ()),
        ("os.posix_spawn", ("/bin/true", ["true"], {})),
        ("socket.connect", (None, ADDRESS)),
        ("socket.bind", (None, ADDRESS)),
    ],
)
def test_a_strict_guard_fails_a_process_or_a_socket(event: str, args: tuple[object, ...]) -> None:
    guard = Guard()
    guard.strict = True
    with pytest.raises(pytest.fail.Exception, match=rf"tried {re.escape(event)}.*tests/integration"):
        guard.audit(event, args)
    assert guard.tried and guard.tried[0].startswith(event)


def test_what_was_tried_fails_the_test_even_when_the_error_was_caught() -> None:
    guard = Guard()
    # caught, as code under test might catch it
    with (
        pytest.raises(pytest.fail.Exception, match=r"socket\.connect"),
        guard.unit_test(),
        contextlib.suppress(BaseException),
    ):
        guard.audit("socket.connect", (None, ADDRESS))
    assert not guard.strict


def test_a_socketpair_and_other_events_pass() -> None:
    guard = Guard()
    guard.strict = True
    for event in ("socket.__new__", "open", "os.kill", "socket.getaddrinfo"):
        guard.audit(event, ())
    left, right = socket.socketpair()  # what asyncio's event loop makes for itself: no connect, no bind
    left.close()
    right.close()
    assert guard.tried == []


def test_the_floors_run_skips_a_process_and_allows_a_socket() -> None:
    guard = Guard()
    guard.skip_processes = True
    guard.audit("socket.connect", (None, ADDRESS))
    with pytest.raises(pytest.skip.Exception, match=r"subprocess\.Popen"):
        guard.audit("subprocess.Popen", ("true", ["true"], None, None))
