"""Trace replay: shared Mooncake blocks become identical prompt text, K2.6's settings, lengths
that hold (ignore_eos), and over HTTP against a twin: the prefix cache reports cached tokens where
the trace says the prompts agree, and every request records when it was due."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import msgspec
import pytest

from loadgen.client import RequestOptions, Target, build_body, settings
from loadgen.datasets import load_dataset
from loadgen.k26 import INSTANT_TEMPERATURE, THINKING_TEMPERATURE, TOP_P, k26_mode, scaled_output
from loadgen.metrics import on_time
from loadgen.trace_dataset import TraceOptions, load_trace
from loadgen.trace_file import BLOCK_TOKENS, TraceRow, TraceSelection
from loadgen.trace_text import PromptText
from tests.support import TRACE_SLICE, loadgen, mooncake_trace
from twin.domain import classify
from twin.prefix_cache import chain_from_text
from twin.text import count_prompt_tokens, render_chat


def _shared_chars(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_shared_blocks_are_identical_text_and_nothing_else_is() -> None:
    text = PromptText("7")
    a = text.prompt(TraceRow(1, 0.0, 3 * BLOCK_TOKENS, 5, (0, 1, 2)))
    b = text.prompt(TraceRow(2, 1.0, 2 * BLOCK_TOKENS + 100, 5, (0, 1, 9)))
    c = text.prompt(TraceRow(3, 2.0, BLOCK_TOKENS + 30, 5, (0, 1)))  # ends inside block 1
    assert len(a) == 4 * 3 * BLOCK_TOKENS and len(b) == 4 * (2 * BLOCK_TOKENS + 100)
    assert _shared_chars(a, b) == pytest.approx(4 * 2 * BLOCK_TOKENS, abs=4)  # blocks 0 and 1, not 2 vs 9
    assert a.startswith(c)  # a partial block is the start of the whole one
    # rows without block ids (Azure) share nothing, not even with each other's first block
    d, e = text.prompt(TraceRow(4, 0.0, 600, 5)), text.prompt(TraceRow(5, 0.0, 600, 5))
    assert _shared_chars(d, e) < 8 and _shared_chars(d, a) < 8
    # another seed, other text: one run does not hit the cache another filled
    assert _shared_chars(PromptText("8").prompt(TraceRow(1, 0.0, 512, 5, (0,))), a) < 8


def test_prompt_text_is_one_twin_token_per_word_and_reads_as_chat() -> None:
    row = TraceRow(1, 0.0, 6758, 5, tuple(range(14)))
    rendered = render_chat([("user", PromptText().prompt(row))])
    assert count_prompt_tokens(rendered) == pytest.approx(6758, abs=3)
    assert classify(rendered) == "chat"
    # the twin's prefix chain of two prompts agrees exactly as far as their blocks do
    a = chain_from_text(render_chat([("user", PromptText().prompt(TraceRow(1, 0, 2048, 5, (0, 1, 2, 3))))]))
    b = chain_from_text(render_chat([("user", PromptText().prompt(TraceRow(2, 0, 2048, 5, (0, 1, 2, 4))))]))
    same = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert same == 3 * BLOCK_TOKENS // 64


def test_k26_mode_holds_its_share_and_kimis_sampling() -> None:
    modes = [k26_mode(0.7, 3, i) for i in range(1000)]
    assert sum(m.thinking for m in modes) == pytest.approx(700, abs=2)
    assert sum(m.thinking for m in modes[:20]) == pytest.approx(14, abs=1)  # no clumps
    assert {m.temperature for m in modes if m.thinking} == {THINKING_TEMPERATURE}
    assert {m.temperature for m in modes if not m.thinking} == {INSTANT_TEMPERATURE}
    assert {m.top_p for m in modes} == {TOP_P}
    assert [k26_mode(0.7, 3, i) for i in range(50)] == modes[:50]  # the seed decides
    assert [k26_mode(0.7, 4, i) for i in range(50)] != modes[:50]
    assert scaled_output(350, True, 3.0) == 1050 and scaled_output(350, False, 3.0) == 350
    assert not any(k26_mode(0.0, 1, i).thinking for i in range(100))
    assert all(k26_mode(1.0, 1, i).thinking for i in range(100))


def test_trace_requests_carry_lengths_and_k26_settings() -> None:
    replay = load_trace(str(TRACE_SLICE), TraceOptions(thinking_share=0.5, thinking_scale=2.0), seed=1)
    opts = RequestOptions()
    for i in range(6):
        p = replay.prompt(i)
        b = msgspec.json.decode(build_body(Target(label="t", url="u", model="m"), p, opts, settings(p, opts, i)))
        row = replay.trace.rows[i]
        think = replay.mode(i).thinking
        assert b["max_tokens"] == row.output_tokens * (2 if think else 1)
        assert b["ignore_eos"] is True  # the trace's length holds
        assert b["temperature"] == (1.0 if think else 0.6) and b["top_p"] == 0.95
        assert b["chat_template_kwargs"] == {"thinking": think}


def test_thinking_share_sets_k26_settings_on_any_dataset() -> None:
    ds = load_dataset("math")
    opts = RequestOptions(thinking_share=0.7, seed=2)
    got = [settings(ds.prompts[0], opts, i) for i in range(10)]
    assert [s.thinking for s in got] == [k26_mode(0.7, 2, i).thinking for i in range(10)]
    assert {(s.thinking, s.temperature, s.top_p) for s in got} == {(True, 1.0, 0.95), (False, 0.6, 0.95)}


def test_on_time_is_two_percent_of_the_offset_with_a_floor() -> None:
    assert on_time(19.0, 1000.0) and not on_time(21.0, 1000.0)
    assert on_time(4.0, 0.0) and not on_time(6.0, 0.0)


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
