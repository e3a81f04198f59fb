"""Sessions, thinking and tool calls end to end against loadgen's SGLang-shaped test server: the
replayed history is the server's own answers, the session is the unit of concurrency, and the
per-turn, reasoning, tool and cache figures reach summary.json and requests.jsonl."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import aiohttp
import pytest

from loadgen import timescale
from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelResult, LevelSpec
from loadgen.report import level_notes, turn_table
from loadgen.testserver import RunningServer, ServerConfig
from tests.loadgen_runs import run_against_test_server as _run


def test_sessions_replay_the_servers_answers_one_session_per_worker(tmp_path: Path) -> None:
    cfg = ServerConfig(keep_bodies=200, enable_cache_report=True, hold_until_inflight=3, chunk_delay=0.001)
    summary, srv = _run(cfg, "sessions", LevelSpec(concurrency=3, num_prompts=4), tmp_path)
    lv = summary.runs[0].levels[0]
    ds = load_dataset("sessions")
    turns = sum(len(s.turns) for s in ds.take_sessions(4))
    assert lv.sessions == 4 and lv.completed == turns and lv.failed == 0
    assert srv.stats.max_inflight == 3  # three sessions at a time, one request each
    # every later turn carries the answers this server gave, never the file's
    answers = {m["content"] for b in srv.server.bodies for m in b["messages"] if m["role"] == "assistant"}
    assert answers and all(a.startswith(" w0 w1") for a in answers)
    for b in srv.server.bodies:
        roles = [m["role"] for m in b["messages"]]
        assert roles[0] == "system" and roles[-1] == "user"
        assert roles[1:] == ["user", "assistant"] * ((len(roles) - 2) // 2) + ["user"]
    # per-turn figures: the history grows, and so does the prefix the cache already holds
    assert [t.turn for t in lv.turns] == list(range(len(lv.turns))) and len(lv.turns) >= 3
    assert lv.turns[0].completed == 4
    inputs = [t.mean_input_tokens or 0 for t in lv.turns]
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0]
    assert (lv.turns[0].cache_hit_rate or 0) < (lv.turns[1].cache_hit_rate or 0)
    assert lv.total_cached_tokens and lv.cache_hit_rate is not None and 0 < lv.cache_hit_rate < 1
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    by_session: dict[int, list[int]] = {}
    for r in sorted(records, key=lambda r: r["start_s"]):
        by_session.setdefault(r["session"], []).append(r["turn"])
    assert all(ts == list(range(len(ts))) for ts in by_session.values())  # in order
    assert all(r["cached_tokens"] is not None for r in records)
    assert "per turn (4 sessions)" in str(turn_table(lv).title)


def test_think_time_pauses_each_session_between_an_answer_and_its_next_turn(tmp_path: Path) -> None:
    import random

    think = 0.05
    _run(ServerConfig(), "sessions", LevelSpec(concurrency=2, num_prompts=2), tmp_path, think_time_s=think)
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    for session in {r["session"] for r in records}:
        turns = sorted((r for r in records if r["session"] == session), key=lambda r: r["turn"])
        assert len(turns) >= 2
        pauses = random.Random(f"0:think:{session}")  # seeded by --seed (0) and the session
        for before, after in itertools.pairwise(turns):
            answered = before["start_s"] + before["e2e_ms"] / 1000
            assert after["start_s"] - answered >= pauses.expovariate(1 / think) - 0.002


def test_a_failed_turn_ends_its_session() -> None:
    cfg = ServerConfig(http_error_every=2)  # the second request (turn 2 of session 0) fails
    summary, srv = _run(cfg, "sessions", LevelSpec(concurrency=1, num_prompts=1))
    lv = summary.runs[0].levels[0]
    assert lv.completed == 1 and lv.failed == 1 and srv.stats.requests == 2


def test_thinking_stream_figures(tmp_path: Path) -> None:
    cfg = ServerConfig(reasoning_tokens=20, chunk_pattern=[1, 3, 2], chunk_delay=0.001)
    summary, _ = _run(cfg, "chat", LevelSpec(concurrency=2, num_prompts=4), tmp_path, max_tokens=40)
    lv = summary.runs[0].levels[0]
    assert lv.reasoning_requests == 4 and lv.total_reasoning_tokens == 4 * 21  # + the </think> token
    assert lv.median_ttft_answer_ms is not None and lv.median_ttft_ms is not None
    assert lv.median_ttft_answer_ms > lv.median_ttft_ms == lv.median_ttft_reasoning_ms
    assert lv.thinking == {"default": 4} and lv.itl_token_counts == "usage"
    assert any(n.startswith("thinking: 4 requests, 21 reasoning tokens") for n in level_notes(lv))
    for r in (json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()):
        assert r["ttft_reasoning_ms"] == r["ttft_ms"] < r["ttft_answer_ms"]
        assert r["reasoning_tokens"] == 21 and r["output_tokens"] == 40 and r["token_mismatch"] is None


def test_thinking_off_sends_the_switch_and_gets_no_reasoning() -> None:
    cfg = ServerConfig(reasoning_tokens=20, keep_bodies=10)
    summary, srv = _run(cfg, "chat", LevelSpec(concurrency=1, num_prompts=2), thinking="off")
    lv = summary.runs[0].levels[0]
    assert lv.reasoning_requests == 0 and lv.median_ttft_reasoning_ms is None
    assert lv.median_ttft_answer_ms == lv.median_ttft_ms and lv.thinking == {"off": 2}
    assert all(b["chat_template_kwargs"] == {"thinking": False} for b in srv.server.bodies)


@pytest.mark.parametrize("stream", [True, False])
def test_tool_calls_are_answers(stream: bool) -> None:
    cfg = ServerConfig(reasoning_tokens=6, keep_bodies=10)
    summary, srv = _run(cfg, "tools", LevelSpec(concurrency=2, num_prompts=4), max_tokens=48, stream=stream)
    lv = summary.runs[0].levels[0]
    assert lv.completed == 4 and lv.tool_call_requests == 4 and lv.finish_reasons == {"tool_calls": 4}
    assert lv.median_ttft_answer_ms is not None and lv.token_count_mismatches == 0
    assert all("tools" in b and "ignore_eos" not in b for b in srv.server.bodies)


def test_temperature_mix_is_counted() -> None:
    summary, _ = _run(ServerConfig(), "math", LevelSpec(concurrency=2, num_prompts=6), temperatures=(0.0, 1.0))
    assert summary.runs[0].levels[0].temperatures == {"0": 3, "1": 3}


def test_queue_full_stream_is_a_stream_error() -> None:
    summary, _ = _run(ServerConfig(queue_full_every=2), "chat", LevelSpec(concurrency=1, num_prompts=4))
    lv = summary.runs[0].levels[0]
    assert lv.completed == 2 and lv.errors == {"stream_error": 2}


def test_turn_figures_rescale_with_time() -> None:
    cfg = ServerConfig()

    async def main() -> LevelResult:
        from loadgen.client import Target
        from loadgen.driver import run_level

        async with RunningServer(cfg) as srv, aiohttp.ClientSession() as http:
            target = Target(label="t", url=srv.url, model="test-model")
            return await run_level(
                http,
                target,
                load_dataset("sessions"),
                LevelSpec(concurrency=1, num_prompts=1),
                RequestOptions(max_tokens=4),
            )

    result = asyncio.run(main())
    sim = timescale.to_simulated(result, 0.5)
    for a, b in zip(result.level.turns, sim.level.turns, strict=True):
        assert b.median_ttft_ms == pytest.approx((a.median_ttft_ms or 0) / 0.5)
        assert b.mean_input_tokens == a.mean_input_tokens


@pytest.mark.parametrize(
    "args, message",
    [
        (("--think-time", "2", "--dataset", "math"), "--think-time needs a session dataset"),
        (("--think-time", "-1", "--dataset", "sessions"), "argument --think-time: must be a number of seconds"),
        (("--think-time", "inf", "--dataset", "sessions"), "argument --think-time: must be a number of seconds"),
    ],
)
def test_think_time_errors_exit_2(args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from loadgen.cli import main

    try:
        code = main(["--target", "http://127.0.0.1:9", *args])
    except SystemExit as ex:
        code = ex.code
    assert code == 2 and message in capsys.readouterr().err
