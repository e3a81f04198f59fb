"""Baseline policies and the prompt-domain classifier."""

import collections
import random

import pytest

from backends import BackendSpec, Strategy
from policies import BackendView, Domain, NoCandidate, RequestFeatures, classify, make_policy


def _views(*inflight: int) -> list[BackendView]:
    return [
        BackendView(spec=BackendSpec(name=f"b{i}", url="http://x", model="m", strategy=Strategy.AR), inflight=n)
        for i, n in enumerate(inflight)
    ]


REQ = RequestFeatures(model="m")


def test_least_inflight_picks_the_least_loaded():
    assert make_policy("least_inflight").choose(REQ, _views(3, 1, 2)).backend.name == "b1"


def test_least_inflight_breaks_ties_at_random_not_first_in_list():
    policy = make_policy("least_inflight")
    counts = collections.Counter(policy.choose(REQ, _views(0, 0, 0)).backend.name for _ in range(3000))
    assert set(counts) == {"b0", "b1", "b2"}
    assert all(800 < n < 1200 for n in counts.values()), counts


def test_unhealthy_backends_are_skipped_and_none_left_raises():
    views = _views(0, 5)
    views[0].healthy = False
    assert make_policy("least_inflight").choose(REQ, views).backend.name == "b1"
    views[1].healthy = False
    with pytest.raises(NoCandidate):
        make_policy("least_inflight").choose(REQ, views)


def test_round_robin_cycles():
    policy = make_policy("round_robin")
    assert [policy.choose(REQ, _views(9, 0, 0)).backend.name for _ in range(6)] == ["b0", "b1", "b2"] * 2


def test_pinned_never_reroutes():
    policy = make_policy("pinned", pinned_backend="b1")
    views = _views(0, 9)
    assert policy.choose(REQ, views).backend.name == "b1"
    views[1].healthy = False
    with pytest.raises(NoCandidate):
        policy.choose(REQ, views)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fastest")


@pytest.mark.parametrize(
    "text,domain",
    [
        (
            "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many clips in total?",
            Domain.MATH,
        ),
        ("Solve the equation 3x + 5 = 20.", Domain.MATH),
        ("What is 17 * 23?", Domain.MATH),
        ("Write a Python function that returns the n-th Fibonacci number.", Domain.CODE),
        ("```js\nfunction f(a) { return a + 1; }\n```\nWhy does this return NaN for 2+2?", Domain.CODE),
        ("Implement binary search in Rust.", Domain.CODE),
        ("Tell me about the history of the Roman Empire.", Domain.CHAT),
        ("Write a short poem about autumn leaves.", Domain.CHAT),
        ("", Domain.CHAT),
    ],
)
def test_domain_classifier_rules(text, domain):
    assert classify(text) == domain


def test_classifier_reads_only_the_end_of_long_prompts():
    text = "Write a python function. " * 10 + "x" * 5000 + " Tell me a story about a dragon."
    assert classify(text) == Domain.CHAT


def test_random_prompts_never_crash_the_classifier():
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 300)))
        assert classify(text) in set(Domain)
