"""Quick studies run end to end as real processes: twins started and stopped by the study itself,
and dying with it (the rules and data: tests/unit/test_loadgen_study.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support import loadgen


def _dead(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/ready", timeout=1)
    except (urllib.error.URLError, OSError):
        return True
    return False


def _wait_dead(url: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _dead(url):
            return True
        time.sleep(0.1)
    return False


def _start_and_wait_for_twin(out: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        loadgen("study", "k26-ar-sweep", "--quick", "--output", str(out), "--no-progress", "--no-plots"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    log = out / "logs" / "k26-ar.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if "http://" in text:
            url = "http://" + text.split("http://", 1)[1].split()[0]
            if not _dead(url):
                return proc, url
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("twin did not come up")


def test_quick_study_end_to_end_with_a_missed_reference(tmp_path: Path) -> None:
    """One quick run covers the outputs, the rows, the failure exit code (a deliberately wrong
    R1) and the twin being stopped afterwards."""
    out = tmp_path / "study"
    p = subprocess.run(
        loadgen(
            "study",
            "k26-ar-sweep",
            "--quick",
            "--output",
            str(out),
            "--reference",
            "R1=1000",
            "--tolerance",
            "25",
            "--no-progress",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "measured vs reference" in p.stdout and "FAILED" in p.stdout
    assert "Traceback" not in p.stderr
    for name in (
        "summary.json",
        "summary.csv",
        "requests.jsonl",
        "study.json",
        "throughput_aggregate.png",
        "throughput_single.png",
        "ttft.png",
    ):
        assert (out / name).stat().st_size > 0, name
    study = json.loads((out / "study.json").read_text())
    assert study["study"] == "k26-ar-sweep" and study["time_scale"] == 0.05
    assert study["quick"] is True and study["errors"] == [] and study["passed"] is False
    rows = study["rows"]
    assert [r["key"] for r in rows] == ["R1", "R2"] + ["R3"] * 6
    for r in rows:
        assert {"reference", "measured", "error_pct", "pass", "provenance"} <= set(r)
        assert r["measured"] is not None and r["error_pct"] is not None
    r1 = rows[0]
    assert r1["reference"] == 1000 and r1["pass"] is False and r1["error_pct"] < -90
    # figures are in simulated time: ~26 tok/s per request at C=1, ~20 s per batch
    assert r1["measured"] == pytest.approx(26.3, rel=0.25)
    # In simulated time the batches of the small levels match R3. From C=8 on, a 0.05x twin must
    # emit 20x the real chunk rate from one Python process, which a loaded 2-core machine cannot
    # (an older loadgen against the same twin measures the same): --quick is the smoke test of the
    # study machinery, the real-timing study is the measurement (docs/metrics.md, "Time-scaled twins").
    assert all(r["pass"] for r in rows[2:5]), rows[2:5]
    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["target"] == "k26-ar" and run["time_scale"] == 0.05
    assert [lv["max_concurrency"] for lv in run["levels"]] == [1, 2, 4, 8, 16, 32]
    assert [lv["completed"] for lv in run["levels"]] == [1, 2, 4, 8, 16, 32]
    assert all(lv["total_output_tokens"] == 512 * lv["completed"] for lv in run["levels"])
    assert len((out / "requests.jsonl").read_text().splitlines()) == 63
    from matplotlib.image import imread

    for png in ("throughput_aggregate.png", "throughput_single.png", "ttft.png"):
        img = imread(out / png)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert _wait_dead(study["targets"]["k26-ar"]["url"]), "twin left running"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_children_die_with_the_study(tmp_path: Path, sig: signal.Signals) -> None:
    proc, twin = _start_and_wait_for_twin(tmp_path)
    time.sleep(0.3)  # let the first level start
    os.kill(proc.pid, sig)
    code = proc.wait(20)
    if sig == signal.SIGTERM:  # orderly: stops the twin, writes what it has, exit 130
        assert code == 130, proc.stderr.read().decode() if proc.stderr else ""
        assert json.loads((tmp_path / "study.json").read_text())["interrupted"] is True
    # SIGKILL: nothing runs in loadgen; PR_SET_PDEATHSIG takes the twin down
    assert _wait_dead(twin), f"twin {twin} outlived the study ({sig.name})"
