"""loadgen as a process against the twin (backends/sim) and through the gateway."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import loadgen


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(loadgen(*args), capture_output=True, text=True, timeout=90)


def test_against_twins_speculative_and_autoregressive(twin_factory, tmp_path: Path) -> None:
    dflash, ar = twin_factory("k26-dflash"), twin_factory("k26-ar")
    p = _run(
        "--target",
        f"{dflash},{ar}",
        "--concurrency",
        "1,4",
        "--max-tokens",
        "48",
        "--num-prompts",
        "8",
        "--dataset",
        "math",
        "--output",
        str(tmp_path),
        "--no-plots",
    )
    assert p.returncode == 0, p.stderr
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert [r["model"] for r in runs] == ["kimi-k2.6", "kimi-k2.6"]
    for run in runs:
        for lv in run["levels"]:
            assert lv["completed"] == 8 and lv["failed"] == 0
            assert lv["total_output_tokens"] == 8 * 48  # server usage, ignore_eos honoured
            assert lv["token_count_mismatches"] == 0
    spec_levels, ar_levels = runs[0]["levels"], runs[1]["levels"]
    # DFlash block 8: several tokens per verify step; AR reports no speculation at all
    assert all(2.0 < lv["accept_length"] <= 8.0 for lv in spec_levels)
    assert all(lv["mean_tokens_per_chunk"] > 1.5 for lv in spec_levels)
    assert all(lv["accept_length"] is None for lv in ar_levels)
    assert all(lv["mean_tokens_per_chunk"] == pytest.approx(1.0) for lv in ar_levels)
    # per-token ITL: speculation makes it shorter than AR's at the same load
    assert spec_levels[0]["median_itl_ms"] < ar_levels[0]["median_itl_ms"]
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 32 and all(json.loads(x)["domain"] == "math" for x in lines)


def test_through_gateway_counts_backends_from_header(gateway_url: str, tmp_path: Path) -> None:
    p = _run(
        "--target",
        "gateway,k26-ar",
        "--gateway-url",
        gateway_url,
        "--concurrency",
        "4",
        "--max-tokens",
        "16",
        "--num-prompts",
        "12",
        "--output",
        str(tmp_path),
        "--no-plots",
    )
    assert p.returncode == 0, p.stderr
    gw, ar = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert gw["url"] == gateway_url and ar["url"] != gateway_url  # k26-ar resolved to its twin
    assert sum(gw["levels"][0]["backends"].values()) == gw["levels"][0]["completed"] == 12
    assert ar["levels"][0]["backends"] == {}  # straight to the backend: no gateway header
    assert ar["levels"][0]["completed"] == 12
