"""Scale-out's documented bound, on real processes: gateway replicas behind HAProxy, in front of twins.

A burst sent at once reaches the backends faster than any replica's next /v1/loads poll, so each
replica admits up to its own per-backend limit: N replicas x min(admission.backend_max_inflight, cap)
in all. The test checks that each replica keeps to its limit (its own specroute_inflight, polled), and that
what the backends hold stays within N x min(B, C) - C past their cap, give or take requests in the act of
finishing. deploy/local/scaleout.py measures the same setups with steady load
too (the figures in docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import shutil
import sys
from pathlib import Path

import pytest

from tests.support import REPO

CAP = 6


def _scaleout():
    path = REPO / "deploy" / "local" / "scaleout.py"
    spec = importlib.util.spec_from_file_location("deploy_local_scaleout", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scaleout():
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
    return _scaleout()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("replicas", "backend_max_inflight"), [(1, 0), (3, math.ceil(CAP / 3))])
def test_burst_overshoot_stays_within_the_documented_bound(scaleout, tmp_path, replicas, backend_max_inflight):
    burst = 6 * CAP  # twice what the three backends run at once
    with scaleout.setup(tmp_path, replicas, CAP, backend_max_inflight, time_scale=0.1, seed=3) as (url, twins, gws):
        result = asyncio.run(scaleout.burst(url, twins, gws, burst, CAP))
    assert result["status_200"] == burst, result  # the excess waits (in a gateway or a backend), nothing is refused
    per_replica = min(backend_max_inflight or CAP, CAP)
    # What each replica sent each backend at most: the invariant the bound is made of.
    assert all(v <= per_replica for peaks in result["replica_peak_inflight"] for v in peaks.values()), result
    assert max(v for peaks in result["replica_peak_inflight"] for v in peaks.values()) == per_replica, result
    # What the backends held: within the bound, give or take the requests a replica has finished (read to
    # the last byte, slot freed, next one sent) that the backend has not yet let go of: at most one per
    # replica and backend was seen.
    bound = max(0, replicas * per_replica - CAP)
    assert all(v <= bound + replicas for v in result["overshoot"].values()), (result, bound)
