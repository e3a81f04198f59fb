"""Prefill cost with attention's pair term: the formula, the fit over server windows, and learning
it from the twin's engine through the counters SGLang publishes and the gateway's own counts."""

from __future__ import annotations

import random

import pytest

from backends import Strategy
from policies.estimates import BackendEstimate
from policies.prefill import PrefillModel, causal_pairs
from policies.priors import DEFAULT_PRIORS
from twin.engine import Engine
from twin.profile import load_profile


def test_causal_pairs_are_the_query_key_pairs_of_the_new_tokens():
    rng = random.Random(0)
    for _ in range(200):
        prompt = rng.randrange(1, 100_000)
        uncached = rng.randrange(0, prompt + 1)
        cached = prompt - uncached
        # every new token attends to the cached ones and to the new ones up to itself
        assert causal_pairs(prompt, uncached) == pytest.approx(((cached + uncached) ** 2 - cached**2) / 2)
    assert causal_pairs(100, 0) == 0.0
    assert causal_pairs(100, 500) == causal_pairs(100, 100)  # no more new tokens than the prompt


def test_windows_of_different_prompt_lengths_separate_the_token_pair_and_pass_costs():
    model = PrefillModel(0.04, 0.08e-3, 3.1e-9)
    rng = random.Random(1)
    for _ in range(60):
        length = rng.choice((500, 2000, 8000, 30_000, 60_000))  # each window's prompts
        q, m = length / 2, 1 / length  # pairs per token, prompts per token
        model.observe_rate(0.12e-3 + 1.24e-9 * q + 0.038 * m, q, m)
    assert model.per_token_s == pytest.approx(0.12e-3, rel=0.02)
    assert model.pair_s == pytest.approx(1.24e-9, rel=0.05)
    assert model.fixed_s == pytest.approx(0.038, rel=0.05)
    # a 64k-token document costs several times a short turn per token
    long_doc, turn = model.stall_s(65_536, causal_pairs(65_536, 65_536)), model.stall_s(512, causal_pairs(512, 512))
    assert long_doc / 65_536 > 1.3 * turn / 512


def test_windows_of_alike_prompts_leave_the_pair_and_pass_costs_at_their_priors():
    model = PrefillModel(0.04, 0.08e-3, 3.1e-9)
    for _ in range(30):
        model.observe_rate(0.15e-3, 2000.0, 1 / 4000)
    assert model.pair_s == pytest.approx(3.1e-9, rel=0.01) and model.fixed_s == pytest.approx(0.04, rel=0.01)
    assert model.per_token_s == pytest.approx(0.15e-3 - 3.1e-9 * 2000.0 - 0.04 / 4000, rel=0.01)


def test_a_window_of_unknown_length_counts_only_where_no_window_has_a_known_one():
    sized = PrefillModel(0.04, 0.08e-3, 2e-9)
    for length in (2000, 18_000, 2000, 18_000):
        sized.observe_rate(0.1e-3 + 2e-9 * length / 2 + 0.04 / length, length / 2, 1 / length)
    before = (sized.per_token_s, sized.pair_s, sized.fixed_s, sized.server_rate)
    # its prompts were the long ones (a prompt of ours was part-way at every report): left out
    sized.observe_rate(0.2e-3, None, None)
    assert (sized.per_token_s, sized.pair_s, sized.fixed_s, sized.server_rate) == before
    # a gateway that never counts (another replica's traffic only) learns one cost per token
    blind = PrefillModel(0.04, 0.08e-3, 2e-9)
    for _ in range(20):
        blind.observe_rate(0.2e-3)
    assert blind.per_token_s == pytest.approx(0.2e-3) and blind.pair_s == 2e-9


def test_an_idle_ttft_is_fitted_after_taking_off_the_pair_cost():
    with_pairs, without = PrefillModel(0.04, 0.1e-3, 1e-9), PrefillModel(0.04, 0.1e-3, 0.0)
    for tokens in (1000, 20_000, 4000, 30_000, 500, 16_000) * 5:
        pairs = causal_pairs(tokens, tokens)
        ttft = 0.05 + 0.1e-3 * tokens + 1e-9 * pairs
        with_pairs.observe(ttft, tokens, pairs)
        without.observe(ttft, tokens)
    assert with_pairs.per_token_s == pytest.approx(0.1e-3, rel=0.05)
    assert without.per_token_s > 1.1e-4  # a linear rate absorbs the pairs of the long ones


def test_the_cost_model_prices_a_long_history_above_its_tokens_alone():
    est = BackendEstimate("a", Strategy.DFLASH, DEFAULT_PRIORS[Strategy.DFLASH])
    short, long_ = (
        est.prefill_stall_s(1024, causal_pairs(1024, 1024)),
        est.prefill_stall_s(1024, causal_pairs(65_536, 1024)),
    )
    # the same 1,024 new tokens after a 64k-token cached history attend to all of it
    assert long_ > 1.5 * short
    assert est.prefill_s(1024) == est.step_s(1) + est.prefill.per_token_s * 1024


def _learn_from_the_twin(seed: int) -> BackendEstimate:
    """Requests of 0.5k-60k-token prompts arrive at a DFlash twin every 3 s on average (virtual:
    about half its prefill capacity). Every 1 s the gateway side polls the engine's prefill
    counters, as `gateway/poller.py` does, with its own counts: a prompt counted at its first
    token, and unknown while one of its prompts is pending."""
    engine = Engine(load_profile("k26-dflash"), seed=seed)
    est = BackendEstimate("twin", Strategy.DFLASH, DEFAULT_PRIORS[Strategy.DFLASH])
    rng = random.Random(seed)
    pending: dict[str, float] = {}
    done_tokens, done_pairs, done_prompts = 0, 0.0, 0
    now, next_arrival, next_poll, n = 0.0, 0.0, 1.0, 0
    while n < 400 or pending:
        if n < 400 and now >= next_arrival:
            prompt = rng.choice((512, 2000, 6000)) if rng.random() < 0.7 else rng.randrange(16_000, 60_000)
            rid = f"r{n}"
            engine.submit(rid, prompt, 24, domain="chat")
            pending[rid] = prompt
            n += 1
            next_arrival += rng.expovariate(1 / 3.0)
        if now >= next_poll:
            st = engine.stats()
            own = None if pending else (float(done_tokens), done_pairs, float(done_prompts))
            est.note_counters(None, (float(st.total_prefill_busy_us), float(st.total_prompt_tokens)), own)
            next_poll += 1.0
        result = engine.step()
        now += result.duration_s if result.duration_s > 0 else min(next_arrival, next_poll) - now
        for em in result.emissions:
            prompt = pending.pop(em.rid, None)
            if prompt is not None:
                done_tokens += prompt
                done_pairs += causal_pairs(int(prompt), int(prompt))
                done_prompts += 1
    return est


def test_the_pair_cost_is_learned_from_the_servers_counters_and_the_gateways_counts():
    profile = load_profile("k26-dflash").step
    for seed in (0, 1):
        est = _learn_from_the_twin(seed)
        assert est.prefill.server_rate >= 20
        assert est.prefill.per_token_s == pytest.approx(profile.prefill_ms_per_token / 1e3, rel=0.1)
        # the prior (3.1 ms per million pairs) is 2.5x the twin's: the windows move it there
        assert est.prefill.pair_s == pytest.approx(profile.prefill_attn_ms_per_mpair / 1e9, rel=0.25)
