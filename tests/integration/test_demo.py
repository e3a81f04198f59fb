"""`specroute demo` (what `make demo` runs) end to end, shortened: its gateway, twins and loadgen as
real processes; every target of the served model gets traffic and nothing fails."""

import json
import subprocess
import sys
from pathlib import Path

from tools.topology import SEED_SYSTEMS


def test_demo_sweeps_the_gateway_and_each_backend_of_its_model(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["--concurrency", "2", "--max-tokens", "16", "--level-seconds", "1", "--sim-time-scale", "0.2"]
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "demo", *args, "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "demo finished" in proc.stdout
    runs = json.loads((out / "summary.json").read_text())["runs"]
    served = SEED_SYSTEMS[0].model
    expected = ["gateway", *(s.name for s in SEED_SYSTEMS if s.model == served)]
    assert [r["target"] for r in runs] == expected
    for run in runs:
        (level,) = run["levels"]
        assert level["completed"] > 0 and level["failed"] == 0, run["target"]
    # the gateway's requests went to backends of its pool, and the log of its children was kept
    gateway_level = runs[0]["levels"][0]
    assert set(gateway_level["backends"]) <= set(expected[1:])
    assert (out / "gateway.log").stat().st_size > 0


def test_bad_levels_are_refused_before_anything_starts(capsys) -> None:
    from tools.cli import main

    for levels in ("abc", "4,0", "1,,4"):
        try:
            code = main(["demo", "--concurrency", levels])
        except SystemExit as ex:
            code = ex.code
        assert code == 2
        err = capsys.readouterr()
        assert "expected comma-separated integers >= 1" in err.err and "starting" not in err.out
