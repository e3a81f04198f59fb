"""The quick sweep's rounds: acceptance rounds of as many verify passes whatever the server accepts,
context rounds that prefill a bounded number of prompt tokens."""

from __future__ import annotations

from tools.fit.algorithms import classify
from tools.fit.discover import ServerFacts
from tools.fit.measurements import Level, Request
from tools.fit.sweep import QUICK_CONTEXT_TOKENS, _accept_tokens, plan_sweep


def _facts(kv: int = 200_000) -> ServerFacts:
    return ServerFacts(
        url="http://x",
        max_running_requests=48,
        max_total_tokens=kv,
        context_length=131072,
        classification=classify("NGRAM"),
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
    return Level(
        kind="step",
        concurrency=len(requests),
        prompt_tokens=64,
        max_tokens=96,
        temperature=0.0,
        thinking=False,
        ignore_eos=True,
        domains=list(per_pass),
        requests=requests,
    )


def test_a_server_that_accepts_little_gets_shorter_rounds_of_as_many_passes():
    plan = plan_sweep(_facts(), quick=True)
    levels = [_step_round({"math": 1.5, "code": 1.25, "chat": 6.0})]
    math_tokens = _accept_tokens(plan, levels, "math")
    assert math_tokens == plan.accept_passes * 1.5 < plan.accept_tokens
    assert _accept_tokens(plan, levels, "code") == plan.accept_passes * 1.25
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
