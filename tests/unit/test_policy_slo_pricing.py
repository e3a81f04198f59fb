"""The goodput policy prices the TPOT SLO as well as TTFT and e2e, and its priors follow the
evidence: a long context moves a request off a short-trained EAGLE-3 head."""

import pytest

from backends import BackendSpec, Strategy
from policies import BackendView, Domain, Goodput, Outcome, RequestFeatures
from policies.cost import kv_bound, own_and_imposed_s
from policies.estimates import Estimates
from policies.priors import DEFAULT_PRIORS, LONG_CONTEXT_TOKENS, cell_of, cell_priors


def _view(name: str, strategy: Strategy = Strategy.AR, **kw) -> BackendView:
    return BackendView(spec=BackendSpec(name=name, url="http://x", model="m", strategy=strategy), **kw)


def _teach(policy: Goodput, backend: str, *, step_s: float, accept: float | None, tokens: int = 513) -> None:
    for _ in range(20):
        verify = round(tokens / accept) if accept else None
        policy.observe(
            Outcome(
                backend=backend,
                domain=Domain.CHAT,
                inflight_at_dispatch=1,
                completion_tokens=tokens,
                decode_s=(verify or tokens - 1) * step_s,
                verify_ct=verify,
                features=RequestFeatures(model="m", domain=Domain.CHAT, temperature=0.0),
            )
        )


@pytest.mark.parametrize(("tpot_slo_s", "chosen"), [(None, "slow-ar"), (0.1, "queued-dflash")])
def test_a_decode_past_the_tpot_slo_loses_to_a_longer_wait_within_it(tpot_slo_s, chosen):
    """A short answer: an idle AR server that decodes at 120 ms a token finishes it first (2.4 s),
    a DFlash server behind a 25k-token prefill later (~3.3 s) at 12.5 ms a token. Priced on e2e
    alone the AR server wins and the request misses a 100 ms TPOT SLO that the other meets."""
    policy = Goodput(seed=1, epsilon=0.0, bonus=0.0, ttft_slo_s=None, tpot_slo_s=tpot_slo_s)
    ar, dflash = _view("slow-ar"), _view("queued-dflash", Strategy.DFLASH, pending_prefill=25_000)
    request = RequestFeatures(model="m", domain=Domain.CHAT, temperature=0.0, max_tokens=20)
    policy.choose(request, [ar, dflash])  # registers both
    _teach(policy, "slow-ar", step_s=0.120, accept=None)
    _teach(policy, "queued-dflash", step_s=0.050, accept=4.0)
    assert policy.choose(request, [ar, dflash]).backend.name == chosen


def test_tpot_slo_is_validated_and_reported():
    with pytest.raises(ValueError, match="tpot_slo_s"):
        Goodput(tpot_slo_s=0.0)
    assert Goodput(tpot_slo_s=0.1).describe()["policy"]["tpot_slo_s"] == 0.1
    assert Goodput(tpot_slo_s=None).describe()["policy"]["tpot_slo_s"] is None


def test_priors_put_eagle3_below_dflash_beyond_its_training_length():
    """EAGLE-3's head was trained at 4K and SGLang does not window MLA drafters: past 4K it loses
    far more of its drafts than the windowed DFlash drafter (docs/twin.md)."""
    chat = 2  # domain index
    for strategy in (Strategy.EAGLE3, Strategy.DFLASH):
        cells = cell_priors(DEFAULT_PRIORS[strategy])
        short, long = cells[cell_of(chat, 1.0, 1000)], cells[cell_of(chat, 1.0, 4 * LONG_CONTEXT_TOKENS)]
        assert long < short
    e3 = cell_priors(DEFAULT_PRIORS[Strategy.EAGLE3])
    fl = cell_priors(DEFAULT_PRIORS[Strategy.DFLASH])
    long_cell = cell_of(chat, 1.0, 4 * LONG_CONTEXT_TOKENS)
    short_cell = cell_of(chat, 1.0, 1000)
    assert e3[long_cell] / e3[short_cell] < 0.8 < fl[long_cell] / fl[short_cell]


def test_a_kv_pool_full_of_long_contexts_queues_before_max_running():
    """SGLang admits a request only while its KV fits: 259k tokens hold three 70k-token agent
    calls, so a fourth waits for a slot although 48 may run (the cost counts that wait)."""
    assert kv_bound(259_000, 70_000 + 500) == 3
    assert kv_bound(259_000, 13_000) == 19
    assert kv_bound(None, 70_000) == 0 and kv_bound(1_000, 70_000) == 1
    # a 50k-token request beside the trace's typical 14k ones: room for fourteen of them besides it
    assert kv_bound(259_000, 50_000, 14_000) == 15
    est = Estimates().register("dflash", Strategy.DFLASH)
    cell = cell_of(2, 1.0, 70_000)
    args = (est, cell, 5, 2_000, 500.0, 0.0)  # 5 running, 2k uncached, 500 out, own time only
    unbounded = own_and_imposed_s(*args)
    bounded = own_and_imposed_s(*args, cap=kv_bound(259_000, 70_500))
    decode = 500.0 * est.step_s(6) / est.accept_at(cell)
    assert bounded == pytest.approx(unbounded + (6 - 3) / 3 * decode)
    assert own_and_imposed_s(*args, cap=kv_bound(259_000, 13_000)) == pytest.approx(unbounded)
