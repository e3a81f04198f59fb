"""The quick sweep's rounds: acceptance rounds of as many verify passes whatever the server accepts,
context rounds that prefill a bounded number of prompt tokens, lengths rounds sized from the speed
measured at their temperature."""

from __future__ import annotations

import pytest

from tools.fit.algorithms import classify
from tools.fit.discover import ServerFacts
from tools.fit.measurements import Level, Request
from tools.fit.rounds import request_body
from tools.fit.sweep import (
    LENGTHS_TEMPERATURE,
    MAX_LENGTH_ROUNDS,
    QUICK_CONTEXT_TOKENS,
    _accept_tokens,
    length_rounds,
    plan_sweep,
    sampled_tok_s,
    server_busy_s,
    time_by_kind,
)


def _facts(kv: int = 200_000, cap: int = 48, parser: str | None = None, algorithm: str | None = "NGRAM") -> ServerFacts:
    return ServerFacts(
        url="http://x",
        max_running_requests=cap,
        max_total_tokens=kv,
        context_length=131072,
        classification=classify(algorithm),
        reasoning_parser=parser,
    )


def _step_round(per_pass: dict[str, float], verify: int | None = 100) -> Level:
    requests = [
        Request(
            domain=d,
            temperature=0.0,
            thinking=False,
            completion_tokens=96,
            verify_ct=verify,
            correct_drafts=None if verify is None else round(verify * (tpp - 1)),
        )
        for d, tpp in per_pass.items()
        for _ in range(4)
    ]
    return _level("step", requests, list(per_pass))


def _level(kind: str, requests: list[Request], domains: list[str], temperature: float = 0.0) -> Level:
    """A round of short prompts, greedy unless `temperature`, of these requests."""
    return Level(
        kind=kind,
        concurrency=len(requests),
        prompt_tokens=64,
        max_tokens=max(r.completion_tokens for r in requests),
        temperature=temperature,
        thinking=False,
        ignore_eos=True,
        domains=domains,
        requests=requests,
    )


def test_a_server_that_accepts_little_gets_shorter_rounds_of_as_many_passes():
    plan = plan_sweep(_facts(), quick=True)
    levels = [_step_round({"math": 2.0, "code": 1.5, "chat": 6.0})]
    math_tokens = _accept_tokens(plan, levels, "math")
    assert math_tokens == plan.accept_passes * 2.0 < plan.accept_tokens
    assert _accept_tokens(plan, levels, "code") == plan.accept_passes * 1.5
    # a server accepting much is held to the round's token bound: it gets more passes, not longer rounds
    assert _accept_tokens(plan, levels, "chat") == plan.accept_tokens


def test_without_speculation_details_the_rounds_keep_their_length():
    plan = plan_sweep(_facts(), quick=False)
    assert _accept_tokens(plan, [_step_round({"math": 1.5}, verify=None)], "math") == plan.accept_tokens
    assert _accept_tokens(plan, [], "code") == plan.accept_tokens


def test_quick_context_rounds_prefill_a_bounded_number_of_tokens():
    quick = plan_sweep(_facts(kv=380_000), quick=True)
    assert max(p for _, p in quick.context) == quick.max_prompt_tokens  # the longest prompts still measured
    assert all(c * p <= QUICK_CONTEXT_TOKENS for c, p in quick.context if c > 1)
    # the full sweep fills the KV pool as before
    full = plan_sweep(_facts(kv=380_000), quick=False)
    assert max(c * p for c, p in full.context) > QUICK_CONTEXT_TOKENS


def _timed_round(kind: str, concurrency: int, tok_s: float, temperature: float = 0.0, domain: str = "") -> Level:
    """A round whose requests each decoded 100 tokens at `tok_s` after a 1 s first token."""
    requests = [
        Request(
            domain=domain or ("math", "code", "chat")[i % 3],
            temperature=temperature,
            thinking=False,
            completion_tokens=100,
            ttft_s=1.0,
            e2e_s=1.0 + 100 / tok_s,
        )
        for i in range(concurrency)
    ]
    return _level(kind, requests, [domain] if domain else ["math", "code", "chat"], temperature)


def _sweep_so_far(sampled: dict[str, float]) -> list[Level]:
    """Greedy step rounds at 40 tok/s (C=48) and 60 (C=8), acceptance rounds at C=48 per domain."""
    levels = [_timed_round("step", 8, 60.0), _timed_round("step", 48, 40.0)]
    for d, tok_s in sampled.items():
        levels.append(_timed_round("accept", 48, 45.0, temperature=0.0, domain=d))
        levels.append(_timed_round("accept", 48, tok_s, temperature=LENGTHS_TEMPERATURE, domain=d))
    return levels


def test_the_lengths_rounds_are_sized_at_the_slowest_domains_sampling_speed():
    plan = plan_sweep(_facts(parser="kimi_k2"), quick=True)
    levels = _sweep_so_far({"math": 30.0, "code": 25.0, "chat": 20.0})
    # the slowest domain at the lengths' temperature, not the greedy step rounds' 40 tok/s
    assert sampled_tok_s(levels, 48) == pytest.approx(20.0)
    # moved to another concurrency as the greedy rounds move (60 / 40 from 48 to 8)
    assert sampled_tok_s(levels, 8) == pytest.approx(30.0)
    (spec,) = length_rounds(plan, _facts(parser="kimi_k2"), levels)
    assert spec.max_tokens == int(20.0 * plan.lengths_budget_s)
    # a server sampling twice as fast gets twice the tokens in the same time
    (fast,) = length_rounds(plan, _facts(parser="kimi_k2"), _sweep_so_far({"math": 40.0, "code": 40.0, "chat": 40.0}))
    assert fast.max_tokens == 2 * spec.max_tokens


def test_an_ar_server_sizes_its_lengths_rounds_from_the_step_rounds():
    facts = _facts(algorithm=None, parser="qwen3")
    plan = plan_sweep(facts, quick=True)
    (spec,) = length_rounds(plan, facts, [_timed_round("step", 48, 40.0)])
    assert spec.max_tokens == int(40.0 * plan.lengths_budget_s)


def test_a_thinking_model_measures_thinking_on_and_off_in_one_round():
    facts = _facts(parser="kimi_k2")
    plan = plan_sweep(facts, quick=True)
    rounds = length_rounds(plan, facts, _sweep_so_far({"math": 30.0, "code": 25.0, "chat": 20.0}))
    assert len(rounds) == 1
    spec = rounds[0]
    assert spec.concurrency == 48 and spec.temperature == LENGTHS_TEMPERATURE and not spec.ignore_eos
    on = [spec.domain(i) for i in range(spec.concurrency) if spec.thinks(i)]
    off = [spec.domain(i) for i in range(spec.concurrency) if not spec.thinks(i)]
    # every domain its share of thinking requests, and thinking-off ones beside them
    assert sorted(on) == sorted(["math", "code", "chat"] * plan.lengths_per_domain)
    assert sorted(off) == sorted(["math", "code", "chat"] * 4)
    bodies = [request_body(facts, spec, "q", spec.thinks(i)) for i in (0, spec.concurrency - 1)]
    assert [b["chat_template_kwargs"]["thinking"] for b in bodies] == [True, False]


@pytest.mark.parametrize("cap", [1, 2, 5, 8, 16, 24, 36, 48, 72, 256])
def test_a_small_cap_gets_more_lengths_rounds_within_the_cap(cap):
    facts = _facts(cap=cap, parser="kimi_k2")
    plan = plan_sweep(facts, quick=True)
    rounds = length_rounds(plan, facts, [])
    assert 1 <= len(rounds) <= MAX_LENGTH_ROUNDS
    assert all(r.concurrency <= cap for r in rounds)
    thinking = [r.domain(i) for r in rounds for i in range(r.concurrency) if r.thinks(i)]
    plain = [r.domain(i) for r in rounds for i in range(r.concurrency) if not r.thinks(i)]
    wanted = plan.lengths_per_domain * 3
    if cap >= 8:
        assert len(thinking) >= wanted  # every domain its thinking requests
    else:
        assert len(rounds) == MAX_LENGTH_ROUNDS  # as many as the rounds' bound allows
    assert plain or cap == 1  # the answer lengths without thinking too
    assert set(thinking) == {"math", "code", "chat"}


def test_a_model_without_a_reasoning_parser_gets_thinking_off_rounds_only():
    facts = _facts(cap=16)
    plan = plan_sweep(facts, quick=True)
    rounds = length_rounds(plan, facts, [])
    assert len(rounds) == 3 and all(not r.thinks(i) for r in rounds for i in range(r.concurrency))
    assert sum(r.concurrency for r in rounds) >= plan.lengths_per_domain * 3


def test_the_time_by_kind_counts_what_the_server_computed_apart_from_the_wall_clock():
    a, b, c = _timed_round("step", 8, 60.0), _timed_round("step", 16, 50.0), _timed_round("context", 4, 30.0)
    for lv, wall, prefill, decode in ((a, 2.0, 0.1, 1.5), (b, 3.0, 0.2, 2.0), (c, 9.0, 4.0, 3.0)):
        lv.wall_s, lv.prefill_busy_s, lv.decode_busy_s = wall, prefill, decode
    times = time_by_kind([a, b, c])
    assert list(times) == ["step", "context"]
    assert times["step"][:2] == (2, 5.0) and times["step"][2] == pytest.approx(3.8)
    assert server_busy_s([a, b, c]) == pytest.approx(10.8)
    # a server without the counters (before SGLang 0.5.23): the wall clock only
    c.decode_busy_s = None
    assert time_by_kind([a, b, c])["context"][2] is None and server_busy_s([a, b, c]) is None
