"""deploy/local/dockerhost.py without an engine: finding and stopping the engine an earlier, killed
run left on the data root (it would keep the root locked, and the container tests' engine would never
answer)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.support import REPO, wait_until


def _dockerhost():
    spec = importlib.util.spec_from_file_location("dockerhost_under_test", REPO / "deploy" / "local" / "dockerhost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_dockerd(data_root: Path) -> subprocess.Popen[bytes]:
    """A process whose argv is a dockerd's on `data_root` (argv[0] set with bash's `exec -a`), in
    its own session, as the engine runs."""
    script = f"exec -a dockerd {sys.executable} -c 'import time; time.sleep(600)' --data-root {data_root}"
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def test_the_engine_left_on_our_data_root_is_found_and_stopped_and_no_other(tmp_path):
    dockerhost = _dockerhost()
    ours, other = tmp_path / "docker", tmp_path / "elsewhere"
    stale, unrelated = _fake_dockerd(ours), _fake_dockerd(other)
    try:
        assert wait_until(
            lambda: stale.pid in dockerhost.stale_engines(ours) and unrelated.pid in dockerhost.stale_engines(other)
        )
        assert dockerhost.stale_engines(ours) == [stale.pid]
        assert dockerhost.stop_stale_engines(ours, timeout=10) == [stale.pid]
        assert stale.wait(10) != 0  # ended by its signal
        assert unrelated.poll() is None and dockerhost.stale_engines(other) == [unrelated.pid]
        assert dockerhost.stale_engines(ours) == []
    finally:
        for p in (stale, unrelated):
            p.kill()
            p.wait()
