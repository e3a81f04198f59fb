"""Trace replay over HTTP against a twin: the prefix cache reports cached tokens where the trace
says the prompts agree, and every request records when it was due (the replay's requests
themselves: tests/unit/test_loadgen_trace.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from loadgen.trace_dataset import TraceOptions, load_trace
from loadgen.trace_file import BLOCK_TOKENS, TraceSelection
from tests.support import TRACE_SLICE, loadgen, mooncake_trace


def _trace(tmp_path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    return mooncake_trace(tmp_path / "trace.jsonl", rows)


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


def test_twin_reports_cached_tokens_for_shared_hash_ids(twin_factory, tmp_path: Path) -> None:
    url = twin_factory("k26-dflash", "--enable-cache-report", "--reasoning-parser", "kimi_k2")
    trace = _trace(
        tmp_path,
        [
            (0, 4 * BLOCK_TOKENS, 12, [0, 1, 2, 3]),
            (20_000, 4 * BLOCK_TOKENS, 12, [0, 1, 2, 9]),  # three blocks as the first, then its own
            (40_000, 2 * BLOCK_TOKENS, 12, [0, 21]),  # only the block every prompt starts with
            (60_000, 4 * BLOCK_TOKENS, 12, [0, 1, 2, 3]),  # the first prompt again, all of it
        ],
    )
    out = tmp_path / "out"
    p = subprocess.run(
        loadgen(
            "--target", url, "--dataset", f"trace:{trace}", "--time-scale", "0.02", "--thinking-share", "0.5",
            "--output", str(out), "--no-plots",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    recs = sorted(_records(out), key=lambda r: r["trace_line"])
    assert [r["ok"] for r in recs] == [True] * 4
    cached = [r["cached_tokens"] for r in recs]
    # the twin matches whole 64-token blocks of the rendered prompt: its 6-character role prefix
    # shifts the boundary by less than one block
    assert cached[0] == 0
    assert 3 * BLOCK_TOKENS - 64 <= cached[1] <= 3 * BLOCK_TOKENS
    assert BLOCK_TOKENS - 64 <= cached[2] <= BLOCK_TOKENS
    assert 4 * BLOCK_TOKENS - 128 <= cached[3] <= 4 * BLOCK_TOKENS
    for r in recs:  # the trace's length, x2 when thinking (the default scale 3 applies: 36 or 12)
        assert r["output_tokens"] == (36 if r["thinking"] else 12)
        assert r["temperature"] == (1.0 if r["thinking"] else 0.6)
        assert r["input_tokens"] == pytest.approx(4 * BLOCK_TOKENS if r["trace_line"] != 3 else 2 * BLOCK_TOKENS, abs=8)
    # each was due when the trace had it (in the twin's simulated seconds), and sent no earlier
    assert [r["scheduled_s"] for r in recs] == pytest.approx([0.0, 20.0, 40.0, 60.0])
    assert all(r["start_s"] >= r["scheduled_s"] - 1e-6 for r in recs)
    level = json.loads((out / "summary.json").read_text())["runs"][0]["levels"][0]
    assert level["mode"] == "trace" and level["trace_requests"] == 4
    assert level["trace_lateness_p50_ms"] >= 0 and 0.0 <= level["trace_on_time"] <= 1.0
    assert level["total_cached_tokens"] == sum(cached)
    assert "trace replay: 4 requests" in p.stdout


def test_replay_of_the_committed_slice_against_a_twin(twin_factory, tmp_path: Path) -> None:
    url = twin_factory("k26-eagle3", "--enable-cache-report", "--reasoning-parser", "kimi_k2")
    out = tmp_path / "out"
    p = subprocess.run(
        loadgen(
            "--target", url, "--dataset", f"trace:{TRACE_SLICE}", "--trace-window", "0:60", "--trace-sample", "4:0",
            "--trace-speedup", "2", "--time-scale", "0.02", "--output", str(out), "--no-plots",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    expected = load_trace(str(TRACE_SLICE), TraceOptions(selection=TraceSelection(seconds=60.0, sample=(4, 0))))
    recs = sorted(_records(out), key=lambda r: r["index"])
    assert [r["trace_line"] for r in recs] == [row.line for row in expected.trace.rows]
    assert all(r["ok"] for r in recs)
    assert [r["output_tokens"] for r in recs] == [expected.output_tokens(i) for i in range(len(recs))]
    # at speed-up 2 the requests fall due at half the trace's offsets
    assert [r["scheduled_s"] for r in recs] == pytest.approx([row.at_s / 2 for row in expected.trace.rows])
    share = sum(r["thinking"] for r in recs) / len(recs)
    assert share == pytest.approx(0.7, abs=2 / len(recs))
