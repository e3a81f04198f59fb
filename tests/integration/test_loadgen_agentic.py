"""`--dataset agentic` over HTTP against a twin: a coding-agent loop's calls in order, each with the
context so far and the server's own answers, tool calls where the shape plans them, planned lengths
where it plans text, and the prefix cache holding the loop's growing context."""

from __future__ import annotations

import asyncio
import subprocess

import aiohttp
import pytest

from loadgen.agentic import AgentShape
from loadgen.agentic_replay import AgenticReplay
from loadgen.client import RequestOptions, Target
from loadgen.datasets import Dataset, load_dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.k26 import k26_mode
from tests.support import loadgen

# The Copilot shape's prompts run to 140K tokens; a smaller one keeps the test to seconds (the
# twin reads a whole prompt to classify it) and two loops inside one KV pool.
SMALL = AgentShape(
    calls=(4, 8),
    system_tokens=(2_000, 3_000),
    context_tokens=(1_000, 4_000),
    tool_result_tokens=(200, 1_500),
    answer_tokens=(100, 300),
    copy_share=0.5,
    copy_tokens=(200, 600),
    tool_s=1.0,
)


def test_agent_loops_against_a_twin(twin_factory) -> None:
    url = twin_factory(
        "k26-dflash", "--enable-cache-report", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"
    )
    seed = 4
    replay = AgenticReplay(shape=SMALL, seed=seed)

    async def main() -> LevelResult:
        async with aiohttp.ClientSession() as http:
            return await run_level(
                http,
                Target(label="twin", url=url, model="kimi-k2.6"),
                Dataset("agentic", agentic=replay),
                LevelSpec(concurrency=2, num_prompts=2, time_scale=0.02),
                RequestOptions(),
            )

    recs = asyncio.run(main()).records
    kinds = set()
    for i in range(2):
        loop = replay.loop(i)
        mine = sorted((r for r in recs if r.session == i), key=lambda r: r.turn or 0)
        assert [r.turn for r in mine] == list(range(len(loop.calls)))
        assert all(r.ok for r in mine)
        mode = k26_mode(0.7, seed, i)
        for r, call in zip(mine, loop.calls, strict=True):
            kinds.add(call.kind)
            assert r.thinking is mode.thinking and r.temperature == mode.temperature and r.domain == "code"
            assert r.tools == 4  # every call offers the tools: their schemas are part of the cached prefix
            if call.kind == "tool":
                assert r.finish_reason == "tool_calls"
            else:  # copy-heavy edits and the answer: the planned length, held by ignore_eos
                assert r.output_tokens == call.output_tokens * (3 if mode.thinking else 1)
        # the context grows call by call, and the server holds what it has seen of it
        inputs = [r.input_tokens or 0 for r in mine]
        assert inputs == sorted(inputs) and inputs[0] >= loop.system_tokens + loop.calls[0].added_tokens - 16
        assert all((r.cached_tokens or 0) >= prev * 0.9 for r, prev in zip(mine[1:], inputs, strict=False))
    assert kinds == {"tool", "copy", "answer"}


def test_agentic_dataset_takes_k26_settings_and_refuses_what_it_sets() -> None:
    ds = load_dataset("agentic", seed=2)
    assert ds.agentic is not None and ds.agentic.thinking_share == 0.7 and ds.agentic.seed == 2
    for args, words in (
        (["--max-tokens", "64"], "--max-tokens with --dataset agentic"),
        (["--temperature", "1"], "--temperature with --dataset agentic"),
        (["--trace-window", "0:10"], "--trace-window needs --dataset trace:PATH"),
    ):
        p = subprocess.run(
            loadgen("--target", "http://127.0.0.1:9", "--dataset", "agentic", *args),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and words in p.stderr, p.stderr


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_agentic_thinking_share_is_per_loop(share: float) -> None:
    replay = AgenticReplay(thinking_share=share)
    loop = replay.loop(0)
    prompts = [replay.prompt(0, loop, k, replay.opening(loop)) for k in range(len(loop.calls))]
    assert {p.thinking for p in prompts} == {share == 1.0}
    assert {p.temperature for p in prompts} == {1.0 if share else 0.6}
