"""tests/unit: pure, in-process tests. A test here that starts a process or opens a socket fails
(tests/unit_only.py); `make unit` runs this folder alone."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.unit_only import GUARD


# Setup and teardown too: a fixture that starts a process is the test's doing.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with GUARD.unit_test():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with GUARD.unit_test():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    with GUARD.unit_test():
        return (yield)
