"""The fit's parts on data whose answer is known: the solver, the laws' inversions, the censored
length fit, the sweep's plan (no held-out point measured, every round within the KV pool)."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from tools.fit.algorithms import classify
from tools.fit.discover import ServerFacts
from tools.fit.fit_accept import _solve_miss, fit_power_law, fit_window_law, mean_drafts
from tools.fit.fit_lengths import Sample, fit_lengths
from tools.fit.regress import nnls_relative
from tools.fit.sweep import HELD_OUT_CONCURRENCY, HELD_OUT_PROMPTS, plan_sweep
from twin.engine import Engine
from twin.profile import load_profile


def test_nnls_recovers_the_coefficients_and_holds_a_negative_one_at_zero():
    rows = [[1.0, b, b * b] for b in (1, 2, 4, 8, 16, 32)]
    exact = [10 + 0.5 * b + 0.01 * b * b for _, b, _ in rows]
    sol = nnls_relative(rows, exact)
    assert sol.coef == pytest.approx((10, 0.5, 0.01), rel=1e-6) and sol.worst < 1e-9
    falling = [10 + 0.5 * b - 0.01 * b * b for _, b, _ in rows]  # a cost that falls with b: not one of ours
    sol = nnls_relative(rows, falling)
    assert sol.coef[2] == 0.0 and min(sol.coef) >= 0.0 and sol.worst > 0.0
    with pytest.raises(ValueError):
        nnls_relative(rows, [0.0] * len(rows))


def test_the_acceptance_law_is_the_one_the_twin_samples():
    profile = load_profile("k26-dflash")
    engine = Engine(profile, seed=3)
    m = profile.max_accept_drafts
    drafts = passes = 0
    keys = random.Random(2)  # prompt keys are 64-bit hashes: their top bits give the prompt's offset
    for i in range(400):
        r = engine.submit(f"r{i}", 50, 64, domain="chat", key=keys.getrandbits(64))
        while not engine.idle:
            engine.step()
        drafts, passes = drafts + r.correct_drafts, passes + r.verify_ct
    # the twin's own per-prompt variation: the law's mean over u must match the sampled one
    got = drafts / passes
    want = mean_drafts(1 - profile.acceptance.chat, profile.acceptance.prompt_spread, m)[0]
    assert got == pytest.approx(want, rel=0.03)
    q = _solve_miss(got, profile.acceptance.prompt_spread, m)
    assert 1 - q == pytest.approx(profile.acceptance.chat, abs=0.01)


def test_context_laws_come_back_from_their_own_values():
    window = {n: 1 + 0.12 * max(0.0, math.log2(n / 2048)) for n in (1536, 6144, 12288, 24576)}
    law = fit_window_law(window, None)  # the window unreported, between two measured lengths
    assert law is not None and law.window == 2048 and law.per_doubling == pytest.approx(0.12, rel=1e-6)
    law = fit_window_law(window, 2048)
    assert law is not None and (law.window, law.window_reported) == (2048, True)
    assert law.per_doubling == pytest.approx(0.12, rel=1e-6) and law.rms < 1e-9
    power = {n: (n / 4096) ** 0.3 if n > 4096 else 1.0 for n in (1536, 6144, 12288, 24576)}
    p = fit_power_law(power)
    assert p is not None and p.trained == 4096 and p.exponent == pytest.approx(0.3, rel=1e-6)
    assert fit_window_law({}, None) is None and fit_power_law({}) is None


def test_censored_lengths_recover_the_median_and_spread():
    rng = random.Random(1)
    normal = NormalDist()
    budget = 900
    samples = []
    for domain, median in (("math", 600), ("code", 400), ("chat", 200)):
        for _ in range(200):
            x = round(median * math.exp(0.5 * normal.inv_cdf(rng.random())))
            samples.append(Sample(domain, min(x, budget), x >= budget))
    fit = fit_lengths(samples, budget)
    assert fit.censored > 20  # the budget cut a good part of the math answers
    assert fit.median["math"] == pytest.approx(600, rel=0.1) and fit.median["chat"] == pytest.approx(200, rel=0.1)
    assert fit.spread == pytest.approx(0.5, abs=0.06)
    # taking the censored lengths for finished ones would have pulled the math median down
    naive = fit_lengths([Sample(s.domain, s.tokens, False) for s in samples], budget)
    assert naive.median["math"] < 0.95 * fit.median["math"]
    with pytest.raises(ValueError, match="too few finished requests for math"):
        fit_lengths([Sample("math", budget, True)] * 5 + samples[200:], budget)


def _facts(cap: int, kv: int, context: int = 262144) -> ServerFacts:
    return ServerFacts(
        url="http://x:1",
        reachable=True,
        max_running_requests=cap,
        max_total_tokens=kv,
        context_length=context,
        classification=classify("DFLASH"),
    )


@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize("cap", [1, 12, 24, 48, 256])
def test_the_sweep_measures_no_held_out_point_and_fits_its_kv_pool(quick, cap):
    plan = plan_sweep(_facts(cap, 200_000), quick=quick)
    assert not set(plan.step_levels) & HELD_OUT_CONCURRENCY and max(plan.step_levels) <= cap
    assert not set(plan.prefill_lengths) & HELD_OUT_PROMPTS
    assert all(c * (p + plan.context_tokens) <= 200_000 for c, p in plan.context)
    assert all(c <= cap for c, _ in plan.context) and plan.accept_concurrency <= cap


def test_the_sweep_stays_inside_the_context_length():
    plan = plan_sweep(_facts(48, 1_000_000, context=8192), quick=False)
    assert plan.max_prompt_tokens < 8192 and max(plan.prefill_lengths) <= plan.max_prompt_tokens
