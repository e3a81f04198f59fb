"""`loadgen --endpoint responses` (OpenAI's Responses API, `POST /v1/responses`): levels, sessions,
thinking and errors against real twin processes (which serve SGLang 0.5.23's `/v1/responses`);
the body and the event parser: tests/unit/test_loadgen_responses_body.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.targets import resolve
from tests.support import loadgen
from tests.unit.test_loadgen_responses_body import RESPONSES

# ------------------------------------------------------------------------------ the body


# ---------------------------------------------------------------------- the event parser


# ------------------------------------------------------------------------- against twins


def _level(url: str, dataset: str, spec: LevelSpec, opts: RequestOptions, model: str | None = None) -> LevelResult:
    async def main() -> LevelResult:
        async with aiohttp.ClientSession() as http:
            target = await resolve(http, url, gateway_url=url, model=None, api_key=None)
            if model is not None:
                target = msgspec.structs.replace(target, model=model)
            return await run_level(http, target, load_dataset(dataset), spec, opts)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def plain(twin_factory: Any) -> str:
    url: str = twin_factory("k26-ar")
    return url


@pytest.mark.parametrize("stream", [True, False])
def test_a_level_against_the_twin(plain: str, stream: bool) -> None:
    opts = msgspec.structs.replace(RESPONSES, stream=stream)
    result = _level(plain, "mixed", LevelSpec(concurrency=2, num_prompts=4), opts)
    lv = result.level
    assert (lv.completed, lv.failed) == (4, 0) and lv.total_output_tokens == 4 * 24
    assert lv.accept_length is None  # no sglext on /v1/responses
    for r in result.records:
        assert r.ok and r.status == 200 and r.error is None
        assert r.output_tokens == 24 and r.output_tokens_source == "usage" and r.token_mismatch is None
        assert r.finish_reason == "length"  # the twin runs to its budget: response.incomplete
        assert r.ttft_ms is not None and r.e2e_ms is not None and r.ttft_ms <= r.e2e_ms
        assert r.input_tokens and r.cached_tokens is not None  # the Responses usage always has cached_tokens
        assert r.spec_verify_ct is None
    if stream:
        assert lv.itl_token_counts == "text_length" and lv.median_itl_ms is not None
        assert all(r.client_chunks > 1 and r.decode_throughput for r in result.records)
    else:
        assert all(r.client_chunks == 1 and r.ttft_ms == r.e2e_ms for r in result.records)


def test_sessions_replay_the_answers(plain: str) -> None:
    opts = msgspec.structs.replace(RESPONSES, thinking="off")
    result = _level(plain, "sessions", LevelSpec(concurrency=2, num_prompts=3), opts)
    ds = load_dataset("sessions")
    assert result.level.completed == sum(len(s.turns) for s in ds.take_sessions(3)) and result.level.failed == 0
    turns: dict[int | None, list[int | None]] = {}
    for r in sorted(result.records, key=lambda r: r.start_s):
        turns.setdefault(r.session, []).append(r.turn)
    assert all(ts == list(range(len(ts))) for ts in turns.values()) and len(turns) == 3
    inputs = [t.mean_input_tokens or 0 for t in result.level.turns]
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0]  # each turn sends the history so far
    # the history is the twin's own answers, so the next turn finds them in its prefix cache
    assert (result.level.turns[1].cache_hit_rate or 0) > (result.level.turns[0].cache_hit_rate or 0)


def test_thinking_splits_reasoning_from_the_answer_like_chat(twin_factory: Any) -> None:
    url = twin_factory("k26-dflash", "--reasoning-parser", "kimi_k2")
    spec = LevelSpec(concurrency=2, num_prompts=4)
    opts = RequestOptions(endpoint="responses", max_tokens=1200, thinking="on")
    result = _level(url, "chat", spec, opts)
    lv = result.level
    assert lv.completed == 4 and lv.reasoning_requests == 4 and lv.token_count_mismatches == 0
    assert lv.median_ttft_reasoning_ms == lv.median_ttft_ms
    assert lv.median_ttft_ms is not None and lv.median_ttft_answer_ms is not None
    assert lv.median_ttft_ms < lv.median_ttft_answer_ms
    answered = 0
    for r in result.records:
        # no ignore_eos on /v1/responses: an answer ends at its EOS, or at the budget
        assert r.reasoning_tokens and 0 < r.reasoning_tokens <= r.output_tokens <= 1200
        assert r.thinking is True and r.ttft_ms == r.ttft_reasoning_ms
        if r.ttft_answer_ms is not None:
            answered += 1
            assert r.ttft_ms is not None and r.ttft_answer_ms > r.ttft_ms
    assert answered >= 1
    # the input items render as the chat messages do: same prompt, so the same reasoning length
    chat = _level(url, "chat", spec, msgspec.structs.replace(opts, endpoint="chat"))
    for a, b in zip(result.records, chat.records, strict=True):
        assert (a.input_tokens, a.reasoning_tokens) == (b.input_tokens, b.reasoning_tokens)


def test_errors_are_failed_records_with_the_servers_message(twin_factory: Any, plain: str) -> None:
    url = twin_factory("k26-ar", "--context-length", "40")
    spec = LevelSpec(concurrency=1, num_prompts=2)
    streamed = _level(url, "math", spec, RESPONSES)  # streamed: 200, then response.failed
    for r in streamed.records:
        assert not r.ok and r.status == 200 and r.error == "stream_error"
        assert r.error_detail and "maximum context length of 40 tokens" in r.error_detail
    whole = _level(url, "math", spec, msgspec.structs.replace(RESPONSES, stream=False))  # not streamed: a 400
    for r in whole.records:
        assert not r.ok and r.error == "http_400" and "maximum context length" in (r.error_detail or "")
    unknown = _level(plain, "math", LevelSpec(concurrency=1, num_prompts=1), RESPONSES, model="nope")
    r = unknown.records[0]
    assert (r.ok, r.error, r.error_detail) == (False, "http_404", "The model 'nope' does not exist")
    assert unknown.level.failed == 1 and unknown.level.completed == 0


def test_cli_endpoint_responses(plain: str, tmp_path: Path) -> None:
    args = ("--target", plain, "--endpoint", "responses", "--concurrency", "2", "--num-prompts", "4")
    p = subprocess.run(
        loadgen(*args, "--max-tokens", "16", "--output", str(tmp_path), "--no-plots", "--no-progress"),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert p.returncode == 0, p.stderr
    assert "--endpoint responses: max_output_tokens = --max-tokens + 2" in " ".join(p.stdout.split())
    lv = json.loads((tmp_path / "summary.json").read_text())["runs"][0]["levels"][0]
    assert (lv["completed"], lv["total_output_tokens"], lv["accept_length"]) == (4, 64, None)
    p = subprocess.run(loadgen(*args, "--ignore-eos"), capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "no ignore_eos" in p.stderr and "Traceback" not in p.stderr
