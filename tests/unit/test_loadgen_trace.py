"""Trace replay: shared Mooncake blocks become identical prompt text, K2.6's settings, lengths
that hold (ignore_eos) (over HTTP against a twin: tests/integration/test_loadgen_trace_twin.py)."""

from __future__ import annotations

import msgspec
import pytest

from loadgen.client import RequestOptions, Target, build_body, settings
from loadgen.datasets import load_dataset
from loadgen.k26 import INSTANT_TEMPERATURE, THINKING_TEMPERATURE, TOP_P, k26_mode, scaled_output
from loadgen.metrics import on_time
from loadgen.trace_dataset import TraceOptions, load_trace
from loadgen.trace_file import BLOCK_TOKENS, TraceRow
from loadgen.trace_text import PromptText
from tests.support import TRACE_SLICE
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
