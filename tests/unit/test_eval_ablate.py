"""The learning-quality ablation: goodput's rule fed some of the twin's truths."""

import pytest

from evaluate import ablate as ab
from evaluate.oracle import OracleEstimates
from evaluate.scenarios import Mix, Phase, Scenario
from evaluate.sim import simulate
from policies.goodput import Goodput

SMALL = Scenario(
    name="ablate-small",
    description="",
    pool=("k26-dflash", "k26-ddtree:b=8", "k26-eagle3"),
    phases=(
        Phase(
            name="busy",
            duration_s=40.0,
            arrival="poisson",
            load=0.8,
            domains={"math": 1.0, "chat": 1.0, "code": 1.0},
            mix=Mix(chat=0.6, thinking=0.3, temperatures=((0.0, 1.0), (1.0, 1.0)), turns=(2, 3), think_s=2.0),
        ),
    ),
    min_tokens=64,
    max_tokens=128,
)


def _choices(factory):
    run = simulate(SMALL, factory, seed=3)
    return [(r.rid, r.backend) for r in run.records]


def test_every_truth_reproduces_the_clairvoyant_choice_by_choice():
    def rule(estimates):
        return Goodput("latency", seed=3, epsilon=0.0, bonus=0.0, estimates=estimates)

    everything = _choices(lambda e, s: rule(ab.MixedEstimates(e, s, ("accept", "step", "prefill"))))
    clairvoyant = _choices(lambda e, s: rule(OracleEstimates(e)))
    assert len(everything) > 50
    assert everything == clairvoyant


def test_no_truth_is_the_learned_policy_and_a_truth_changes_the_choices():
    def rule(estimates):
        return Goodput("latency", seed=3, epsilon=0.0, bonus=0.0, estimates=estimates)

    learned = _choices(lambda e, s: rule(ab.MixedEstimates(e, s, ())))
    shipped = _choices(lambda e, s: Goodput("latency", seed=3, backends=s, epsilon=0.0, bonus=0.0))
    assert learned == shipped
    assert _choices(lambda e, s: rule(ab.MixedEstimates(e, s, ("step",)))) != learned


def test_the_mean_kv_truth_keeps_a_running_mean_of_the_engines_kv_per_request():
    seen = []

    def spy(e, s):
        est = ab.MixedEstimates(e, s, ("step-avg-kv",))
        seen.append(est)
        return Goodput("latency", seed=3, epsilon=0.0, bonus=0.0, estimates=est)

    simulate(SMALL, spy, seed=3)
    means = [m.kv_mean for m in seen[0].backends.values()]
    assert all(m is not None and m > 0 for m in means)


def test_ablate_averages_per_phase_and_names_every_variant():
    res = ab.ablate(SMALL, [0], [frozenset(), frozenset({"accept"})])
    assert set(res) == {"goodput", "goodput, no exploration", "truths: none", "truths: accept", "clairvoyant"}
    tok, good = res["clairvoyant"]["busy"]
    assert tok > 0 and good > 0


def test_bad_truths_and_scenarios_are_named(capsys):
    with pytest.raises(ValueError, match="unknown truth"):
        ab.MixedEstimates({}, [], ("steps",))
    assert ab.main(["--truths", "accept+stepp"]) == 2
    assert "'accept+stepp'" in capsys.readouterr().err
    assert ab.main(["--scenario", "nope"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.main(["--seed", "1,1"])


def test_the_command_prints_each_variant_against_the_clairvoyant(monkeypatch, capsys):
    monkeypatch.setitem(ab.SCENARIOS, SMALL.name, SMALL)
    assert ab.main(["--scenario", SMALL.name, "--truths", "step"]) == 0
    out = capsys.readouterr().out
    assert "truths: step" in out and "clairvoyant" in out
    assert "(1.000)" in out.splitlines()[-1]  # the clairvoyant against itself
