"""The policy evaluation harness: virtual clock, eval.json schema, determinism, the oracle."""

import json

import pytest

from evaluate.cli import main
from evaluate.metrics import SETTLE_S
from evaluate.oracle import true_accept_length
from evaluate.runner import run_scenario
from evaluate.scenarios import SCENARIOS, Degrade, Phase, Scenario
from twin.engine import Engine
from twin.profile import load_profile

TINY = Scenario(
    name="tiny",
    description="two backends, two short phases",
    pool=("k26-ar", "k26-dflash"),
    phases=(
        Phase(name="low", duration_s=20.0, concurrency=2, domains={"math": 1.0}),
        Phase(name="high", duration_s=20.0, concurrency=6, domains={"chat": 1.0, "code": 1.0}),
    ),
    min_tokens=64,
    max_tokens=128,
)
FIELDS = {
    "aggregate_tok_s",
    "mean_request_tok_s",
    "p50_request_tok_s",
    "p99_ttft_ms",
    "backend_share",
    "clairvoyant_ratio",
}


def test_tiny_scenario_runs_every_contestant_with_sane_figures():
    res = run_scenario(TINY, seed=0)
    keys = set(res.phases[0].policies)
    assert keys == {
        "least_inflight",
        "round_robin",
        "threshold",
        "goodput/latency",
        "goodput/throughput",
        "clairvoyant/latency",
        "clairvoyant/throughput",
        "static/k26-ar",
        "static/k26-dflash",
        "sglang/round_robin",
        "sglang/power_of_two",
        "sglang/least_load",
        "sglang/cache_aware",
    }
    for ph in res.phases:
        for key, m in ph.policies.items():
            assert m.requests > 0 and m.aggregate_tok_s > 0, key
            assert sum(m.backend_share.values()) == pytest.approx(1.0), key
        assert ph.policies["clairvoyant/latency"].clairvoyant_ratio == pytest.approx(1.0)
        assert ph.policies["static/k26-ar"].backend_share["k26-ar"] == 1.0
        # AR decodes ~26 tok/s per request (docs/studies.md, R1): the virtual clock keeps real time units
        assert ph.policies["static/k26-ar"].mean_request_tok_s == pytest.approx(26, rel=0.1)


def test_cli_writes_eval_json_with_the_schema(tmp_path, capsys):
    assert main(["--scenario", "steady-1", "--output", str(tmp_path), "--objective", "latency"]) == 0
    out = capsys.readouterr().out
    assert "goodput/latency" in out and "== targets" in out
    doc = json.loads((tmp_path / "eval.json").read_text())
    assert (tmp_path / "eval.md").read_text().startswith("Closed loop on the virtual clock")
    assert doc["objectives"] == ["latency"] and doc["seed"] == 0
    phases = doc["scenarios"]["steady-1"]["phases"]
    assert list(phases) == ["math", "code", "chat"]
    for phase in phases.values():
        assert phase["concurrency"] == 1
        assert {"least_inflight", "threshold", "goodput/latency", "clairvoyant/latency", "static/k26-ar"} <= set(
            phase["policies"]
        )
        for entry in phase["policies"].values():
            assert set(entry) >= FIELDS
    assert {t["name"].split(" ")[0] for t in doc["targets"]} >= {"goodput/latency"}


def test_cli_refuses_an_unknown_scenario(tmp_path, capsys):
    assert main(["--scenario", "nope", "--output", str(tmp_path)]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert main(["--output", str(tmp_path), "--objective", "fastest"]) == 2


def test_same_seed_same_results_other_seed_other_results():
    a = run_scenario(TINY, seed=4, objectives=("latency",))
    b = run_scenario(TINY, seed=4, objectives=("latency",))
    c = run_scenario(TINY, seed=5, objectives=("latency",))
    assert [p.policies for p in a.phases] == [p.policies for p in b.phases]
    assert [p.policies for p in a.phases] != [p.policies for p in c.phases]


def test_degrade_is_noticed_and_measured():
    scenario = Scenario(
        name="degrade-tiny",
        description="",
        pool=("k26-eagle3", "k26-dflash"),
        phases=(
            Phase(name="before", duration_s=30.0, concurrency=2, domains={"math": 1.0}),
            Phase(name="after", duration_s=40.0, concurrency=2, domains={"math": 1.0}),
        ),
        degrade=Degrade(backend="k26-dflash", at_s=30.0, scale=0.2),
        min_tokens=64,
        max_tokens=128,
    )
    res = run_scenario(scenario, objectives=("latency",), only=("goodput/latency", "static/k26-dflash"))
    before, after = (p.policies for p in res.phases)
    assert after["static/k26-dflash"].mean_request_tok_s < 0.6 * before["static/k26-dflash"].mean_request_tok_s
    assert before["goodput/latency"].backend_share["k26-dflash"] > 0.5
    assert after["goodput/latency"].backend_share["k26-eagle3"] > 0.5  # away from the broken drafter
    assert res.recovery["latency"]["recovery_s"] is not None


def test_clairvoyant_acceptance_matches_what_the_engine_produces():
    engine = Engine(load_profile("k26-dflash"), seed=0)
    reqs = [engine.submit(str(i), 50, 2000, f"oracle-check-{i}", domain="code") for i in range(60)]
    while not engine.idle:
        engine.step()
    measured = sum((r.completion_tokens - 1) / r.verify_ct for r in reqs) / len(reqs)
    assert true_accept_length(engine, "code") == pytest.approx(measured, rel=0.05)


def test_named_scenarios_cover_the_issue():
    assert {"steady-1", "steady-4", "steady-16", "steady-32", "steady-64", "ramp", "mixed", "degrade", "qwen"} <= set(
        SCENARIOS
    )
    ramp = [p.concurrency for p in SCENARIOS["ramp"].phases]
    assert ramp[0] == 1 and max(ramp) == 64 and ramp[-1] == 1
    assert SCENARIOS["qwen"].pool == ("qwen36-ar", "qwen36-ddtree-b15", "qwen36-ddtree-b64")
    assert all(p.duration_s > 2 * SETTLE_S for s in SCENARIOS.values() for p in s.phases)


def test_best_split_weights_each_backend_by_the_requests_it_completes():
    import numpy as np

    from evaluate.bound import best_split

    # A fast backend that slows steeply with a second request, and a slow flat one. Two clients:
    # both on the fast one: 40 tok/s each; one on each: (1*100^2 + 1*30^2) / (100 + 30) = 83.8,
    # because the fast one completes 100/30 times as many requests; both on the slow one: 30.
    value, split = best_split(np.array([[0.0, 100.0, 40.0], [0.0, 30.0, 30.0]]), 2)
    assert split == [1, 1]
    assert value == pytest.approx(10900 / 130)
    # three backends, five clients: the exhaustive answer
    speeds = np.array([[0, 90, 80, 60, 40, 30], [0, 50, 50, 45, 45, 40], [0, 30, 30, 30, 30, 30]], dtype=float)
    splits = [(a, b, 5 - a - b) for a in range(6) for b in range(6 - a)]

    def ratio(s):
        return sum(n * speeds[i, n] ** 2 for i, n in enumerate(s)) / sum(n * speeds[i, n] for i, n in enumerate(s))

    value, split = best_split(speeds, 5)
    assert value == pytest.approx(max(ratio(s) for s in splits))
    assert ratio(split) == pytest.approx(value)


def test_policy_bound_lies_between_the_domain_blind_best_and_every_request_at_its_best_domain():
    import numpy as np

    from evaluate.bound import best_split, policy_bound

    # backend 0 is fast on domain 0 only, backend 1 is middling on both; half the prompts each
    speeds = np.zeros((2, 2, 4))
    speeds[0, 0, 1:] = [120, 100, 70]
    speeds[0, 1, 1:] = [40, 35, 30]
    speeds[1, 0, 1:] = [60, 55, 50]
    speeds[1, 1, 1:] = [60, 55, 50]
    weights = np.array([0.5, 0.5])
    blind, _ = best_split(np.einsum("bdn,d->bn", speeds, weights), 3)
    optimistic, _ = best_split(speeds.max(axis=1), 3)  # as if every prompt were of its best domain
    bound = policy_bound(speeds, weights, 3)
    # routing by domain can beat the blind split, and no prompt changes its domain
    assert blind < bound < optimistic
    # one domain: nothing to route by, the bound is the best split itself
    single = policy_bound(speeds[:, :1, :], np.array([1.0]), 3)
    assert single == pytest.approx(best_split(speeds[:, 0, :], 3)[0], rel=1e-6)


def test_phase_ceiling_bounds_what_the_policies_measure():
    res = run_scenario(TINY, seed=0)
    low, high = res.phases
    for ph in res.phases:
        c = ph.ceiling
        assert c is not None and sum(c.best_split.values()) == ph.concurrency
        assert c.best_split_request_tok_s <= c.bound_request_tok_s * (1 + 1e-6)
        for key, m in ph.policies.items():
            # steady-state figures: prompt-to-prompt acceptance spread lets a measured mean pass
            # them by a few percent, never by more
            assert m.mean_request_tok_s <= c.bound_request_tok_s * 1.05, (ph.name, key)
    # one domain: the bound is the best split
    assert low.ceiling.best_split_request_tok_s == pytest.approx(low.ceiling.bound_request_tok_s, rel=1e-6)
    # two domains (code accepts more than chat on DFlash): routing by domain could do better
    assert high.ceiling.bound_request_tok_s >= high.ceiling.best_split_request_tok_s


def test_specroute_is_configured_with_the_slo_it_is_judged_on():
    from evaluate.runner import contestants
    from evaluate.slo import SLO

    stated = SLO(ttft_s=10.0, tpot_s=0.1)
    _, factory = contestants(["a", "b"], ("latency",), 0, slo=stated)["goodput/latency"]
    policy = factory([], [])
    assert (policy.ttft_slo_s, policy.tpot_slo_s) == (10.0, 0.1)
    _, factory = contestants(["a", "b"], ("latency",), 0, {"tpot_slo_s": None}, slo=stated)["goodput/latency"]
    policy = factory([], [])
    assert policy.ttft_slo_s == 10.0 and policy.tpot_slo_s == float("inf")  # an explicit option wins
