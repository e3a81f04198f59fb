"""`specroute sim curves` and `specroute sim calibrate --quick` as real commands."""

from __future__ import annotations

import json
import subprocess

from tests.support import SIM_PROFILES, specroute


def test_curves_cover_every_profile_and_level():
    out = subprocess.run(specroute("sim", "curves", "--format", "json"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    profiles = {r["profile"] for r in rows}
    assert profiles >= SIM_PROFILES - {"zero"}
    for name in profiles:
        levels = [r["concurrency"] for r in rows if r["profile"] == name]
        assert levels == [1, 2, 4, 8, 16, 32, 48]
    agg = {r["concurrency"]: r["aggregate_tps"] for r in rows if r["profile"] == "k26-ar"}
    assert agg[32] > 25 * agg[1]  # R3: aggregate grows ~linearly with concurrency
    dflash = [r["speedup_vs_ar"] for r in rows if r["profile"] == "k26-dflash"]
    assert dflash[0] > dflash[-1] > 1


def test_curves_markdown_and_bad_arguments():
    out = subprocess.run(
        specroute("sim", "curves", "--profile", "k26-ar", "--concurrency", "1,2", "--format", "markdown"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert out.stdout.startswith("| profile |") and out.stdout.count("| k26-ar |") == 2
    bad = subprocess.run(specroute("sim", "curves", "--concurrency", "0"), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_calibrate_quick_passes_every_figure():
    out = subprocess.run(
        specroute("sim", "calibrate", "--quick", "--format", "json"), capture_output=True, text=True, timeout=120
    )
    checks = json.loads(out.stdout)
    failed = [c for c in checks if not c["ok"]]
    assert out.returncode == 0 and not failed, failed
    figures = {c["figure"] for c in checks}
    assert {f"R{i}" for i in range(1, 9)} <= figures
    # one row per traffic axis, each with its source figure beside the twin's
    assert {"T1", "T2", "P1", "P2", "C1", "D1", "K1", "H1", "W1"} <= figures
    assert {c["source"] for c in checks} == {"engine", "http"}
