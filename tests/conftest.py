"""Shared fixtures: real processes on loopback."""

from __future__ import annotations

import pytest

from tests.support import free_port, running, specroute

# Twins run 50x faster than the real hardware so that tests finish quickly; timing ratios hold.
TEST_TIME_SCALE = "0.02"


@pytest.fixture(scope="session")
def gateway_url():
    """`specroute serve` with the embedded topology (four twin backends as subprocesses)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(
        specroute("serve", "--twins", "--listen", f"127.0.0.1:{port}", "--sim-time-scale", TEST_TIME_SCALE),
        ready_url=f"{url}/health",
        timeout=90,
    ):
        yield url


@pytest.fixture(scope="session")
def twin_factory():
    """Start extra twin servers on demand; all stopped at the end of the session."""
    import contextlib

    with contextlib.ExitStack() as stack:

        def start(profile: str, *extra: str) -> str:
            port = free_port()
            stack.enter_context(
                running(
                    specroute(
                        "sim", "--profile", profile, "--port", str(port), "--time-scale", TEST_TIME_SCALE, *extra
                    ),
                    ready_url=f"http://127.0.0.1:{port}/ready",
                    timeout=60,
                )
            )
            return f"http://127.0.0.1:{port}"

        yield start


def pytest_configure(config):
    # tests/deploy/test_deploy_docker.py: a real Docker engine, image build and compose stack (skips where
    # docker cannot run); `pytest -m container` runs only those, `-m 'not container'` skips them.
    config.addinivalue_line("markers", "container: builds and runs the image in a Docker engine it starts")
