"""The goodput policy prices the TPOT SLO as well as TTFT and e2e, and the queue past a server's
cap at the slot life measured there; its priors follow the evidence: a long context moves a
request off a short-trained EAGLE-3 head."""

import pytest

from backends import BackendSpec, Strategy
from policies import BackendView, Domain, Goodput, Outcome, RequestFeatures, Resident
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


# Load above a speculative server's cap goes to an AR server with room, when the queue behind the
# cap would break the TTFT SLO and the AR server would not: the wait is priced at the slot life
# the full server shows (its requests' decode seconds), not at the new request's own decode.


def _reported(name: str, strategy: Strategy, cap: int, running: int, waiting: int = 0) -> BackendView:
    """Another gateway's requests: the server reports them, none of them is ours."""
    return _view(
        name, strategy, max_running=cap, reported_running=running, reported_waiting=waiting, reported_inflight=0
    )


SHORT = RequestFeatures(model="m", domain=Domain.CHAT, temperature=0.0, prompt_tokens=500, max_tokens=100)


def _pool(running: int, waiting: int) -> tuple[Goodput, list[BackendView]]:
    """A DFlash server (cap 48, 4 tokens a pass at 50 ms) whose requests hold their slot ~20 s
    (1,600 tokens each), beside an AR server (40 ms a token, 2,048 slots) running as many."""
    policy = Goodput(seed=1, epsilon=0.0, bonus=0.0, ttft_slo_s=10.0, tpot_slo_s=0.1)
    dflash = _reported("dflash", Strategy.DFLASH, 48, running, waiting)
    ar = _reported("ar", Strategy.AR, 2048, running)
    policy.choose(SHORT, [dflash, ar])  # registers both
    _teach(policy, "dflash", step_s=0.050, accept=4.0, tokens=1600)
    _teach(policy, "ar", step_s=0.040, accept=None, tokens=100)
    return policy, [dflash, ar]


@pytest.mark.parametrize(
    ("running", "waiting", "chosen"),
    [
        (20, 0, "dflash"),  # room: 4 tokens a pass beat the AR server's one
        (48, 1, "dflash"),  # full, but the second place in its queue waits ~1 s
        (48, 40, "ar"),  # 41 ahead, 48 slots freed per ~20 s: ~17 s, past the 10 s SLO
    ],
)
def test_a_short_answer_overflows_to_ar_only_when_the_queue_behind_the_cap_breaks_the_slo(running, waiting, chosen):
    policy, views = _pool(running, waiting)
    assert policy.choose(SHORT, views).backend.name == chosen


def test_the_queue_is_paced_by_the_slot_life_measured_there_not_by_the_request():
    """The same queue costs a 100-token answer as long a wait as it costs a 1,600-token one: its
    place in line frees when the requests ahead finish, whatever its own length."""
    est = Estimates().register("dflash", Strategy.DFLASH)
    cell = cell_of(2, 0.0, 500)
    args = (est, cell, 88, 500, 100.0, 0.0)  # 88 on a server of 48 slots, own time only

    def wait(life_s: float) -> float:
        return own_and_imposed_s(*args, cap=48, life_s=life_s) - own_and_imposed_s(*args, cap=48, life_s=1e-9)

    assert wait(20.0) == pytest.approx((89 - 48) / 48 * 20.0)
    # unmeasured: a typical request's decode at the full batch, not this one's
    typical = own_and_imposed_s(*args, cap=48, typical_out=1600.0) - own_and_imposed_s(*args, cap=48, life_s=1e-9)
    assert typical == pytest.approx((89 - 48) / 48 * 1600.0 * est.step_s(48) / est.accept_at(cell))


def test_a_queued_request_charges_the_requests_that_will_queue_behind_it():
    """On a full server it holds a slot for its decode while as many requests as wait ahead of it
    now wait behind it: a long answer costs them more than a short one."""
    est = Estimates().register("dflash", Strategy.DFLASH)
    cell = cell_of(2, 0.0, 500)

    def imposed(out: float, load: int) -> float:
        return own_and_imposed_s(est, cell, load, 0, out, 1.0, cap=48, life_s=20.0) - own_and_imposed_s(
            est, cell, load, 0, out, 0.0, cap=48, life_s=20.0
        )

    # beyond the cap the batch stays at 48: only the queue behind it is charged, by its decode
    decode = 1600.0 * est.step_s(49) / est.accept_at(cell)
    assert imposed(1600.0, 68) - imposed(1600.0, 48) == pytest.approx((69 - 48 - 1) * decode / 48)
    assert imposed(1600.0, 68) > imposed(100.0, 68)


def test_the_ttft_slo_costs_nothing_at_the_slo_and_a_lost_request_past_twice_it():
    """Past the TTFT SLO the request is priced as lost to goodput: from nothing at the SLO (a
    prediction on the edge does not jump) to the time of a request that just made the SLO at twice it."""
    est = Estimates().register("dflash", Strategy.DFLASH)
    cell = cell_of(2, 0.0, 500)

    def cost(life_s: float, slo: float | None) -> float:
        ttft_slo = slo if slo is not None else float("inf")
        return own_and_imposed_s(
            est, cell, 88, 500, 100.0, 0.0, 1.0, 0, ttft_slo, 1.0, cap=48, life_s=life_s, tpot_slo_s=0.1
        )

    def ttft(life_s: float) -> float:  # the predicted TTFT there, without any SLO pricing
        return cost(life_s, None) - 100.0 * est.step_s(89) / est.accept_at(cell)

    edge = ttft(20.0)
    assert cost(20.0, edge) == pytest.approx(cost(20.0, None))  # at the SLO: nothing
    met = edge / 2 + 100.0 * 0.1  # the time a request that just made a TTFT SLO of edge / 2 takes
    assert cost(20.0, edge / 2) == pytest.approx(cost(20.0, None) + edge / 2 + met)  # past twice it: all
    quarter = edge / 1.25  # past it by a quarter of the SLO: a quarter of the lost request
    assert cost(20.0, quarter) == pytest.approx(cost(20.0, None) + (edge - quarter) + 0.25 * (quarter + 10.0))


def test_the_throughput_objective_counts_no_tokens_from_a_request_waiting_for_kv():
    """An AR server whose KV pool (270k tokens) holds ~170 requests like this one, with 200 on it,
    adds nothing for it while it waits; a DFlash server with room adds its tokens now."""
    policy = Goodput("throughput", seed=1, epsilon=0.0, bonus=0.0)
    request = RequestFeatures(model="m", domain=Domain.CHAT, temperature=0.0, prompt_tokens=1000, max_tokens=600)
    dflash = _reported("dflash", Strategy.DFLASH, 48, 47)
    ar = _reported("ar", Strategy.AR, 2048, 170, 30)
    ar.kv_tokens = dflash.kv_tokens = 270_000
    policy.choose(request, [dflash, ar])  # registers both
    _teach(policy, "dflash", step_s=0.050, accept=4.0, tokens=600)
    _teach(policy, "ar", step_s=0.040, accept=None, tokens=600)
    assert policy.choose(request, [dflash, ar]).backend.name == "dflash"
    ar.reported_running, ar.reported_waiting = 100, 0  # room: one more sequence adds a whole one
    assert policy.choose(request, [dflash, ar]).backend.name == "ar"


class _Stream:
    """A running request's stream as the gateway reads it (`policies.base.StreamProgress`)."""

    def __init__(self, chunks: int, tpot_s: float) -> None:
        self.generated = chunks
        self.t_first = 100.0
        self.t_last = 100.0 + (chunks - 1) * tpot_s


def _residents(n: int, tpot_s: float, *, chunks: int = 100, expected: float = 400.0) -> set[Resident]:
    return {Resident(_Stream(chunks, tpot_s), expected) for _ in range(n)}


def _imposed(residents: set[Resident], uncached: int = 4_000, tpot_slo_s: float = 0.1) -> float:
    est = Estimates().register("ar", Strategy.AR)
    cell = cell_of(2, 0.6, uncached)
    # 40 running, a 4k-token prompt, 40 tokens out; TTFT SLO 10 s, TPOT SLO as given
    return own_and_imposed_s(
        est, cell, 40, uncached, 40.0, 1.0, 1.0, 0, 10.0, 1.0, tpot_slo_s=tpot_slo_s, residents=residents
    )


def test_a_prefill_costs_the_residents_it_pushes_past_the_tpot_slo():
    """A 4k-token prompt stalls the running requests' passes ~0.45 s: spread over 400 tokens,
    about 1.1 ms a token. Residents decoding at 99.5 ms a token are pushed past a 100 ms SLO, each
    a request lost to goodput; at 60 ms they keep it, and a resident that has not streamed two
    chunks yet, or without a TPOT SLO, counts nothing."""
    nothing = _imposed(set())
    far = _imposed(_residents(10, 0.060))
    edge = _imposed(_residents(10, 0.0995))
    assert far == nothing
    assert edge > nothing + 10 * 10.0  # at least the TTFT SLO's worth for each of the ten
    assert _imposed(_residents(10, 0.0995, chunks=1)) == nothing
    assert _imposed(_residents(10, 0.0995), tpot_slo_s=float("inf")) == _imposed(set(), tpot_slo_s=float("inf"))
    # a resident already past the SLO is lost either way; a short prompt barely moves the edge ones
    assert _imposed(_residents(10, 0.150)) == nothing
    assert _imposed(_residents(10, 0.0995), uncached=10) == _imposed(set(), uncached=10)


def test_a_resident_past_its_expected_length_is_given_as_many_tokens_again():
    """Expected 50 tokens, 100 streamed: it is assumed to run to 200, so a 0.45 s stall adds
    ~2.3 ms a token to it, not 0.45 s over the 1 token its expectation had left."""
    nothing = _imposed(set())
    assert _imposed(_residents(5, 0.0990, expected=50.0)) > nothing  # within 2.3 ms of the SLO
    assert _imposed(_residents(5, 0.0950, expected=50.0)) == nothing  # 5 ms below: not pushed


def test_a_long_prompt_goes_where_no_resident_is_at_the_tpot_edge():
    """Two identical AR servers with as many requests each: on one, ten of them decode just under
    a 100 ms TPOT SLO; a 4k-token prompt goes to the other, a short one anywhere."""
    policy = Goodput(seed=3, epsilon=0.0, bonus=0.0, hysteresis=0.0, ttft_slo_s=10.0, tpot_slo_s=0.1)
    edge = _view("edge", inflight=40, residents=_residents(10, 0.0995))
    room = _view("room", inflight=40, residents=_residents(10, 0.060))
    long = RequestFeatures(model="m", domain=Domain.CHAT, temperature=0.6, prompt_tokens=4_000, max_tokens=40)
    for _ in range(5):
        assert policy.choose(long, [edge, room]).backend.name == "room"
        assert policy.choose(long, [room, edge]).backend.name == "room"
    decision = policy.choose(long, [edge, room])
    assert decision.expected_tokens == pytest.approx(40.0)  # kept with the request among the residents
    assert policy.describe([edge, room])["backends"]["edge"]["residents_decoding"] == 10
