"""loadgen as a process against the twin (twin/) and through the gateway."""

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
    # per-token ITL: speculation makes it shorter than AR's at the same load. The mean (the decode
    # span over its tokens), not the median: at 0.02x a busy machine delivers some consecutive
    # steps in one read, and those gaps are 0 as the client saw them.
    assert spec_levels[0]["mean_itl_ms"] < ar_levels[0]["mean_itl_ms"]
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


def _level(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["runs"][0]["levels"][0]


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


def test_thinking_tools_and_sessions_against_a_k26_twin(twin_factory, tmp_path: Path) -> None:
    """Thinking, tools and the cache on the real twin (kimi_k2 reasoning and tool parsers, cache report):
    thinking on and off, tool-calling requests, multi-turn sessions; exact tokens per chunk all along."""
    url = twin_factory(
        "k26-dflash", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-cache-report"
    )
    common = ("--target", url, "--concurrency", "2", "--num-prompts", "4", "--no-plots", "--no-progress")

    think = tmp_path / "think"
    p = _run(*common, "--dataset", "chat", "--max-tokens", "400", "--output", str(think))
    assert p.returncode == 0, p.stderr
    lv = _level(think)
    assert lv["completed"] == 4 and lv["reasoning_requests"] == 4 and lv["token_count_mismatches"] == 0
    assert lv["itl_token_counts"] == "usage" and lv["itl_exact_requests"] == 4
    assert lv["median_ttft_reasoning_ms"] == lv["median_ttft_ms"] < lv["median_ttft_answer_ms"]
    for r in _records(think):
        assert 0 < r["reasoning_tokens"] <= r["output_tokens"] == 400 and r["ttft_ms"] == r["ttft_reasoning_ms"]
        if r["reasoning_tokens"] < 400:  # the answer began within max_tokens
            assert r["ttft_answer_ms"] > r["ttft_ms"]
        else:
            assert r["ttft_answer_ms"] is None
        assert r["cached_tokens"] is not None  # --enable-cache-report: reported, 0 or more

    off = tmp_path / "off"
    p = _run(*common, "--dataset", "chat", "--max-tokens", "64", "--thinking", "off", "--output", str(off))
    assert p.returncode == 0, p.stderr
    lv = _level(off)
    assert lv["reasoning_requests"] == 0 and lv["thinking"] == {"off": 4}
    assert lv["median_ttft_answer_ms"] == lv["median_ttft_ms"]

    tools = tmp_path / "tools"
    p = _run(
        *common,
        "--dataset",
        "tools",
        "--num-prompts",
        "6",
        "--max-tokens",
        "300",
        "--thinking",
        "off",
        "--output",
        str(tools),
    )
    assert p.returncode == 0, p.stderr
    lv = _level(tools)
    assert lv["completed"] == 6 and lv["token_count_mismatches"] == 0
    assert lv["tool_call_requests"] >= 1 and lv["finish_reasons"].get("tool_calls") == lv["tool_call_requests"]
    for r in _records(tools):
        assert r["tools"] >= 1
        assert (r["finish_reason"] == "tool_calls") == (r["tool_calls"] >= 1)

    sessions = tmp_path / "sessions"
    p = _run(
        *common,
        "--dataset",
        "sessions",
        "--max-turns",
        "3",
        "--max-tokens",
        "120",
        "--thinking",
        "off",
        "--output",
        str(sessions),
    )
    assert p.returncode == 0, p.stderr
    lv = _level(sessions)
    assert lv["sessions"] == 4 and lv["completed"] == 12 and [t["turn"] for t in lv["turns"]] == [0, 1, 2]
    inputs = [t["mean_input_tokens"] for t in lv["turns"]]
    assert inputs[0] < inputs[1] < inputs[2]  # each turn sends the history so far
    # the twin's radix cache holds the earlier turns: the last turn finds a cached prefix
    assert lv["turns"][2]["cache_hit_rate"] > lv["turns"][0]["cache_hit_rate"]
