"""Live estimates: acceptance per (backend, domain), step time per load, garbage telemetry."""

import math

import msgspec
import pytest

from backends import Strategy
from policies import Domain, Estimates, Outcome, RequestFeatures
from policies.acceptance import Acceptance
from policies.lengths import OutputLengths
from policies.priors import DEFAULT_PRIORS, DOMAIN_INDEX, cell_of
from policies.steptime import StepCurve

MATH, CODE, CHAT = (DOMAIN_INDEX[d] for d in (Domain.MATH, Domain.CODE, Domain.CHAT))
# The acceptance cells of greedy (temperature 0), short-context requests of each domain.
MATH_C, CODE_C, CHAT_C = (cell_of(d, 0.0, 0) for d in (MATH, CODE, CHAT))


def _outcome(backend="spec", domain=Domain.MATH, load=1, tokens=513, step_s=0.05, accept=5.0, **over) -> Outcome:
    """A finished request that saw `load` in flight, `step_s` per pass and `accept` per pass."""
    verify = round(tokens / accept) if accept else None
    fields = dict(
        backend=backend,
        domain=domain,
        inflight_at_dispatch=load,
        completion_tokens=tokens,
        decode_s=(verify or tokens - 1) * step_s,
        verify_ct=verify,
        accept_length=tokens / verify if verify else None,
        ttft_s=0.1,
        features=RequestFeatures(model="m", domain=domain, temperature=0.0),
    )
    fields.update(over)
    return Outcome(**fields)


@pytest.fixture
def est():
    e = Estimates()
    e.register("spec", Strategy.DFLASH)
    e.register("ar", Strategy.AR)
    return e


def test_unseen_backend_uses_its_strategy_prior(est):
    prior = DEFAULT_PRIORS[Strategy.DFLASH]
    b = est.get("spec")
    assert b.accept_length(MATH) == pytest.approx(prior.accept[MATH])
    assert b.step_s(1) == pytest.approx(prior.step.step_s(1))
    # AR prior: ~26 tok/s per request, flat to 32 in flight (docs/studies.md, R1-R3)
    ar = est.get("ar")
    assert 25.0 < ar.rate(MATH, 1) < 27.0
    assert ar.rate(MATH, 32) / ar.rate(MATH, 1) > 0.95


def test_acceptance_converges_per_domain_and_domains_stay_apart(est):
    for _ in range(60):
        est.observe(_outcome(domain=Domain.MATH, accept=6.0))
        est.observe(_outcome(domain=Domain.CHAT, accept=3.0))
    b = est.get("spec")
    assert b.accept_length(MATH) == pytest.approx(6.0, rel=0.03)
    assert b.accept_length(CHAT) == pytest.approx(3.0, rel=0.03)
    assert est.used == 120 and est.skipped == {}


def test_a_drop_seen_in_one_domain_moves_every_domain_at_once():
    acc = Acceptance((5.0, 5.0, 5.0))
    for _ in range(50):
        for c in (MATH_C, CODE_C, CHAT_C):
            acc.observe(c, 5.0)
    for _ in range(6):  # the drafter degrades; only math requests finish so far
        acc.observe(MATH_C, 2.5)
    assert acc.values[CHAT] < 3.6  # chat's own estimate never saw a degraded sample


def test_backend_report_scales_acceptance_before_outcomes_arrive():
    acc = Acceptance((5.0, 5.0, 5.0))
    for _ in range(4):
        acc.note_dispatch(MATH_C)
    acc.note_report(4.8, running=4)  # inside the noise band: no change
    assert acc.values[MATH] == pytest.approx(5.0)
    acc.note_report(2.5, running=4)  # half of what is expected for the 4 in flight
    assert acc.values[MATH] == pytest.approx(2.5)
    assert acc.values[CHAT] == pytest.approx(2.5)
    for _ in range(30):  # outcomes catch up: the drift fades instead of counting twice
        acc.observe(MATH_C, 2.5)
    assert acc.drift == 1.0
    assert acc.values[MATH] == pytest.approx(2.5, rel=0.05)


def test_an_idle_backends_report_or_one_unlucky_request_is_not_a_drift():
    acc = Acceptance((5.0, 5.0, 5.0))
    acc.note_report(2.0, running=0)  # stale window of an idle backend
    assert acc.drift == 1.0
    acc.note_dispatch(CHAT_C)
    acc.note_report(4.0, running=1)  # -20% on one request is within its noise
    assert acc.drift == 1.0


def test_step_time_learned_per_load_bucket_and_borrowed_beyond(est):
    b = est.get("spec")
    prior8 = b.step_s(8)
    for _ in range(20):
        est.observe(_outcome(load=1, step_s=2 * b.curve.prior_s(1)))
    assert b.step_s(1) == pytest.approx(2 * b.curve.prior_s(1), rel=0.01)
    assert b.step_s(8) == pytest.approx(2 * prior8, rel=0.01)  # borrowed: whole curve rescaled
    for _ in range(20):
        est.observe(_outcome(load=16, step_s=4 * b.curve.prior_s(16)))
    assert b.step_s(16) == pytest.approx(4 * b.curve.prior_s(16), rel=0.01)
    assert 2 * b.curve.prior_s(4) < b.step_s(4) < 4 * b.curve.prior_s(4)  # interpolated
    assert b.step_s(1) == pytest.approx(2 * b.curve.prior_s(1), rel=0.01)  # low load untouched


def test_mean_inflight_is_preferred_to_the_count_at_dispatch(est):
    b = est.get("ar")
    est.observe(_outcome(backend="ar", accept=None, load=1, mean_inflight=32.0, step_s=0.1))
    assert b.curve.samples[5] > 0 and b.curve.samples[0] == 0  # bucket 32, not bucket 1


def test_step_curve_interpolates_between_buckets():
    from policies.priors import StepPrior

    curve = StepCurve(StepPrior(t0_s=0.04, k_s=0.0), max_running=256)
    curve.observe(4, 0.04)
    curve.observe(8, 0.08)
    assert curve.step_s(4) == pytest.approx(0.04)
    assert curve.step_s(6) == pytest.approx(0.06)
    assert curve.step_s(8) == pytest.approx(0.08)


@pytest.mark.parametrize(
    "bad,reason",
    [
        (dict(error="upstream 500"), "error"),
        (dict(completion_tokens=0), "too_few_tokens"),
        (dict(completion_tokens=1), "too_few_tokens"),
        (dict(decode_s=None), "bad_decode_s"),
        (dict(decode_s=0.0), "bad_decode_s"),
        (dict(decode_s=-1.0), "bad_decode_s"),
        (dict(decode_s=math.nan), "bad_decode_s"),
        (dict(decode_s=math.inf), "bad_decode_s"),
        (dict(inflight_at_dispatch=0), "bad_load"),
        (dict(verify_ct=None, accept_length=None), "no_spec_details"),
        (dict(verify_ct=None, accept_length=math.nan), "no_spec_details"),
        (dict(verify_ct=1, completion_tokens=500), "bad_accept"),
        (dict(decode_s=1e6), "bad_step"),
        (dict(backend="nobody"), "unknown_backend"),
        (dict(sequences=0), "bad_sequences"),
        (dict(sequences=300), "too_few_tokens"),  # 513 tokens over 300 sequences: under 2 each
    ],
)
def test_garbage_telemetry_is_skipped_and_counted_never_raised(est, bad, reason):
    before = est.get("spec").describe()
    assert est.observe(_outcome(**bad)) is False
    assert est.skipped == {reason: 1}
    assert est.get("spec").describe() == before  # nothing learned from it


def test_wrongly_typed_telemetry_does_not_raise(est):
    # Struct construction does not validate types: a buggy caller can pass anything.
    assert est.observe(_outcome(domain="poetry")) is False
    assert est.observe(_outcome(completion_tokens="many")) is False
    assert est.observe(_outcome(inflight_at_dispatch="x", mean_inflight="y")) is False
    assert est.observe(None) is False  # type: ignore[arg-type]
    assert est.skipped == {"bad_domain": 1, "too_few_tokens": 1, "bad_load": 1, "malformed": 1}


@pytest.mark.parametrize("backend", ["spec", "ar"])
def test_parallel_samples_teach_what_their_sequences_would(backend):
    """n = 4 sequences of one request decode in the same passes, four in the batch: SGLang reports
    their tokens and verify passes summed. Learned alone, one of them says the same."""
    accept = 5.0 if backend == "spec" else None
    one, four = Estimates(), Estimates()
    for e in (one, four):
        e.register("spec", Strategy.DFLASH)
        e.register("ar", Strategy.AR)
    lengths = OutputLengths()
    for _ in range(20):
        single = _outcome(backend=backend, load=4, tokens=513, step_s=0.08, accept=accept)
        assert one.observe(single)
        total_verify = 4 * single.verify_ct if single.verify_ct else None
        parallel = _outcome(backend=backend, load=4, tokens=4 * 513, accept=accept, sequences=4)
        parallel = msgspec.structs.replace(parallel, decode_s=single.decode_s, verify_ct=total_verify)
        assert four.observe(parallel)
        lengths.observe(parallel)
    a, b = one.get(backend), four.get(backend)
    assert b.step_s(4) == pytest.approx(a.step_s(4)) == pytest.approx(0.08, rel=0.02)
    assert b.curve.samples == a.curve.samples
    assert b.accept_length(MATH) == pytest.approx(a.accept_length(MATH))
    assert lengths.expected(RequestFeatures(model="m", domain=Domain.MATH)) == pytest.approx(513)


def test_ar_backend_ignores_acceptance_fields(est):
    assert est.observe(_outcome(backend="ar", accept=None, step_s=0.04))
    assert est.observe(_outcome(backend="ar", verify_ct=3, accept_length=7.0, step_s=0.04))
    assert est.get("ar").accept_length(MATH) == 1.0


def test_memory_is_bounded_whatever_the_traffic(est):
    b = est.get("spec")
    sizes = (len(b.acceptance.values), len(b.curve.ratio), len(b.curve.eff))
    for i in range(2000):
        est.observe(_outcome(domain=list(Domain)[i % 3], load=1 + i % 300, step_s=0.05 + i % 7 * 0.01))
    assert (len(b.acceptance.values), len(b.curve.ratio), len(b.curve.eff)) == sizes
    assert len(est.backends) == 2


def test_an_aborted_answer_teaches_no_output_length():
    lengths = OutputLengths()
    before = lengths.expected(RequestFeatures(model="m", domain=Domain.MATH))
    for _ in range(10):
        lengths.observe(_outcome(tokens=12, finish_reason="abort"))
    assert lengths.expected(RequestFeatures(model="m", domain=Domain.MATH)) == before
    lengths.observe(_outcome(tokens=12, finish_reason="stop"))
    assert lengths.expected(RequestFeatures(model="m", domain=Domain.MATH)) < before
