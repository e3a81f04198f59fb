"""Traces and the agentic shape on the virtual clock: `specroute eval --traffic trace:PATH` and
`specroute plan --traffic trace:PATH` replay a trace with loadgen's semantics (arrivals at the
trace's times, lengths, shared prefixes, K2.6's settings); the agentic shape's loops."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import msgspec
import pytest

from evaluate.cli import main as eval_main
from evaluate.cli_plan import main as plan_main
from evaluate.scenarios import SCENARIOS, Scenario
from evaluate.sim import simulate
from evaluate.sources import AgenticSource, TraceSource, row_chain
from evaluate.traffic import TrafficError, trace_traffic
from loadgen.agentic import AgentShape, draw_loop
from loadgen.k26 import k26_mode
from loadgen.trace_dataset import TraceOptions
from loadgen.trace_file import BLOCK_TOKENS, TraceRow, TraceSelection
from policies.simple import LeastInflight, Pinned
from tests.support import TRACE_SLICE, mooncake_trace


def _trace(tmp_path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    return mooncake_trace(tmp_path / "trace.jsonl", rows)


def _alone(traffic_scenario: Scenario, profile: str) -> Scenario:
    return msgspec.structs.replace(traffic_scenario, pool=(profile,))


def test_row_chains_agree_exactly_as_far_as_the_block_ids() -> None:
    a = row_chain(TraceRow(1, 0.0, 3 * BLOCK_TOKENS, 5, (0, 1, 2)))
    b = row_chain(TraceRow(2, 0.0, 3 * BLOCK_TOKENS, 5, (0, 1, 7)))
    c = row_chain(TraceRow(3, 0.0, BLOCK_TOKENS + 100, 5, (0, 1)))
    per = BLOCK_TOKENS // 64
    assert len(a) == 3 * per and len(c) == (BLOCK_TOKENS + 100) // 64
    assert a[: 2 * per] == b[: 2 * per] and a[2 * per] != b[2 * per]
    assert a[: len(c)] == c  # a partial block is the start of the whole one
    d, e = row_chain(TraceRow(4, 0.0, 600, 5)), row_chain(TraceRow(5, 0.0, 600, 5))
    assert d[0] != e[0]  # rows without ids share nothing


def test_trace_traffic_is_one_phase_at_the_traces_own_rate() -> None:
    t = trace_traffic(str(TRACE_SLICE), TraceOptions(selection=TraceSelection(start_s=10, seconds=60, speedup=2.0)))
    (ph,) = t.scenario.phases
    assert ph.arrival == "trace" and isinstance(ph.source, TraceSource)
    assert ph.duration_s == 30.0 and ph.represents_s == 60.0
    assert t.rates == (pytest.approx(ph.source.requests / 30.0),)
    # `eval --fleet plan` hands plan the scenario without rates: a trace keeps its own
    unrated = msgspec.structs.replace(t, rates=(None,))
    assert unrated.rate_of(0, 4) == unrated.rate_of(0, 8) == pytest.approx(t.rates[0])
    assert t.scenario.pool == ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree")


def test_a_bad_trace_is_a_traffic_error_naming_the_line(tmp_path: Path) -> None:
    path = _trace(tmp_path, [(0, 600, 5, [0, 1]), (5000, 600, 5, [0, 2]), (1000, 600, 5, [0, 3])])
    with pytest.raises(TrafficError, match=rf"^{path}:3: timestamp goes back"):
        trace_traffic(str(path))


def test_replay_sends_every_request_when_the_trace_says_with_its_lengths_and_settings() -> None:
    opts = TraceOptions(selection=TraceSelection(seconds=40.0, speedup=2.0), thinking_share=0.5, thinking_scale=2.0)
    traffic = trace_traffic(str(TRACE_SLICE), opts)
    scenario = _alone(traffic.scenario, "k26-dflash")
    run = simulate(scenario, lambda e, s: LeastInflight(), seed=3)
    rows = traffic.scenario.phases[0].source.trace.rows  # type: ignore[union-attr]
    recs = sorted(run.records + run.failed, key=lambda r: r.rid)
    assert len(recs) == len(rows)
    assert [r.t_send for r in recs] == pytest.approx([row.at_s / 2.0 for row in rows])
    assert [r.prompt_tokens for r in recs] == [row.input_tokens for row in rows]
    for i, (r, row) in enumerate(zip(recs, rows, strict=True)):
        mode = k26_mode(0.5, 3, i)
        assert r.temperature == mode.temperature
        assert r.reasoning_tokens == (row.output_tokens if mode.thinking else 0)  # x2 in all when thinking
        if r.status == "ok":
            assert r.tokens == row.output_tokens * (2 if mode.thinking else 1)


def test_shared_hash_ids_hit_the_servers_prefix_cache(tmp_path: Path) -> None:
    path = _trace(
        tmp_path,
        [
            (0, 4 * BLOCK_TOKENS, 10, [0, 1, 2, 3]),
            (30_000, 4 * BLOCK_TOKENS, 10, [0, 1, 2, 9]),
            (60_000, 2 * BLOCK_TOKENS, 10, [0, 21]),
        ],
    )
    scenario = _alone(trace_traffic(str(path)).scenario, "k26-dflash")
    run = simulate(scenario, lambda e, s: Pinned("k26-dflash"), seed=0)
    cached = [r.cached_tokens for r in sorted(run.records, key=lambda r: r.rid)]
    assert cached == [0, 3 * BLOCK_TOKENS, BLOCK_TOKENS]


def test_eval_cli_runs_a_trace_and_refuses_a_bad_one(tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    argv = ["--traffic", f"trace:{TRACE_SLICE}", "--trace-window", "0:30", "--objective", "latency"]
    argv += ["--output", str(out)]
    assert eval_main(argv) == 0
    doc = json.loads((out / "eval.json").read_text())
    ph = doc["scenarios"]["trace:mooncake_conversation_head400"]["phases"]["trace"]
    assert ph["arrival"] == "trace" and ph["rate_rps"] > 0
    assert "goodput/latency" in ph["policies"] and "sglang/cache_aware" in ph["policies"]
    assert "trace 2." in capsys.readouterr().out  # the phase's row: name and rate
    bad = _trace(tmp_path, [(0, 600, 5, [0, 1]), (0, -4, 5, [0, 2])])
    assert eval_main(["--traffic", f"trace:{bad}", "--output", str(out)]) == 2
    assert f"{bad}:2: input_length -4 is negative" in capsys.readouterr().err
    assert eval_main(["--scenario", "steady-1", "--trace-speedup", "2", "--output", str(out)]) == 2
    assert "need --traffic trace:PATH" in capsys.readouterr().err


def test_plan_cli_plans_for_a_trace(tmp_path: Path, capsys) -> None:
    argv = [
        "--servers", "2", "--traffic", f"trace:{TRACE_SLICE}", "--trace-window", "0:30", "--trace-speedup", "0.5",
        "--types", "k26-ar,k26-dflash", "--jobs", "1", "--seeds", "1", "--output", str(tmp_path),
    ]  # fmt: skip
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    assert "traffic 'trace:mooncake_conversation_head400'" in out and "the trace's window" in out
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert set(doc["rates_rps"]) == {"trace"} and doc["spans_s"] == {"trace": 30.0}
    assert plan_main([*argv[:4], "--verify"]) == 2
    assert "loadgen --dataset trace:PATH" in capsys.readouterr().err


def test_agentic_shape_matches_the_copilot_means() -> None:
    shape = AgentShape()
    loops = [draw_loop(f"t{i}", shape) for i in range(3000)]
    calls = [c for lp in loops for c in lp.calls]
    assert statistics.mean(len(lp.calls) for lp in loops) == pytest.approx(7.83, abs=0.4)
    prompts = []
    for lp in loops:
        tokens, prev = lp.system_tokens, 0
        for c in lp.calls:
            tokens += c.added_tokens + prev
            prompts.append(tokens)
            prev = c.output_tokens
    assert statistics.mean(prompts) == pytest.approx(67_800, rel=0.06)
    assert statistics.mean(c.output_tokens for c in calls) == pytest.approx(527, rel=0.1)
    assert sum(c.kind == "copy" for c in calls) / len(calls) == pytest.approx(0.15, abs=0.02)
    assert all(lp.calls[-1].kind == "answer" for lp in loops)
    assert all(c.copy_from is not None and c.output_tokens <= c.added_tokens + 2400 for c in calls if c.kind == "copy")


def test_agentic_sessions_grow_a_cached_prefix_and_mark_copy_heavy_turns() -> None:
    src = AgenticSource()
    sessions = [src.session(f"s{i}", i, 0) for i in range(300)]
    turns = [t for s in sessions for t in s.turns]
    assert {t.domain for t in turns} == {"code"} and all(t.tools for t in turns)
    assert any(t.copy for t in turns) and all(t.tool_call for t in turns if t.copy)
    for s in sessions:
        for a, b in zip(s.turns, s.turns[1:], strict=False):
            assert b.chain[: len(a.output_chain)] == a.output_chain  # the next call extends what was cached
            assert b.delay_s >= 0
    assert {t.temperature for t in turns} == {0.6, 1.0} and {t.top_p for t in turns} == {0.95}


def test_agentic_scenario_runs_on_the_virtual_clock() -> None:
    sc = SCENARIOS["agentic"]
    phase = msgspec.structs.replace(sc.phases[0], duration_s=120.0)
    alone = msgspec.structs.replace(sc, pool=("k26-dflash",), phases=(phase,))
    run = simulate(alone, lambda e, s: Pinned("k26-dflash"), seed=0)
    assert run.records and {r.kind for r in run.records} == {"agent"}
    # on the server that saw its loop, a call finds most of its prompt cached (the shape's 88%,
    # less what other loops' contexts evicted from a 260K-token pool)
    later = [r for r in run.records if r.turn > 0]
    assert later and sum(r.cached_tokens for r in later) / sum(r.prompt_tokens for r in later) > 0.7
