"""Copy-heavy turns on the virtual clock: a turn that returns an earlier answer drafts from the
NGRAM trie of the server that generated that answer, and only there (evaluate/sim.py)."""

from __future__ import annotations

import random

from evaluate.scenarios import Mix, Phase, Scenario
from evaluate.sim import simulate
from evaluate.workload import draw_session
from policies import Decision, RequestFeatures

REWRITES = Mix(chat=1.0, rewrite=1.0, turns=(2, 3), think_s=1.0, temperatures=((0.0, 1.0),))
SCENARIO = Scenario(
    name="copy-turns",
    description="",
    pool=("k26-ngram", "k26-ar"),
    phases=(Phase(name="rewrites", duration_s=120.0, concurrency=4, domains={"code": 1.0}, mix=REWRITES),),
    min_tokens=400,
    max_tokens=600,
)


class Coin:
    """Sends each request to a backend drawn at random (seeded): a session's turns land on one
    server or on both."""

    name = "coin"

    def __init__(self) -> None:
        self.rng = random.Random(5)
        self.features: list[RequestFeatures] = []

    def choose(self, request, candidates):
        self.features.append(request)
        return Decision(backend=self.rng.choice(list(candidates)), reason="coin")

    def observe(self, outcome) -> None:
        pass


def test_a_rewrite_turn_repeats_the_previous_answer_length_and_names_it() -> None:
    s = draw_session("t", REWRITES, ["code"], [1.0], (400, 600), None)
    first, second = s.turns[0], s.turns[1]
    assert second.copy_of == first.tag and second.answer_tokens == second.copy_tokens == first.answer_tokens
    assert not first.copy_of
    # a mix without rewrites draws the same sessions as before the axis existed
    plain = Mix(chat=1.0, turns=(2, 3), think_s=1.0)
    assert all(not t.copy_of for t in draw_session("t", plain, ["code"], [1.0], (400, 600), None).turns)


def test_only_the_ngram_server_that_wrote_the_answer_drafts_its_rewrite() -> None:
    coin = Coin()
    run = simulate(SCENARIO, lambda engines, specs: coin, seed=1)
    assert any(f.copy_of for f in coin.features)  # the policy is told which turn it copies
    by_turn = {(r.session, r.turn): r for r in run.records}
    same, moved = [], []
    for r in run.records:
        if not r.copy or r.backend != "k26-ngram" or not r.verify_ct:
            continue
        source = by_turn.get((r.session, r.turn - 1))
        if source is not None:
            (same if source.backend == "k26-ngram" else moved).append(r.tokens / r.verify_ct)
    assert len(same) >= 3 and len(moved) >= 3
    plain = [r.tokens / r.verify_ct for r in run.records if r.backend == "k26-ngram" and not r.copy and r.verify_ct]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    # its own answer: 2-4 tokens a pass; another server's answer, like new text (NGRAM's ~1.4)
    assert mean(same) > 2.0 * mean(moved)
    assert abs(mean(moved) / mean(plain) - 1.0) < 0.2
