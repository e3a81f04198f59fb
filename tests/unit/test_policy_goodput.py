"""The goodput and threshold policies on crafted estimates: the flip, hysteresis, exploration."""

import collections
import itertools

import msgspec
import pytest

from backends import BackendSpec, Strategy
from policies import BackendView, Domain, Goodput, NoCandidate, Outcome, RequestFeatures, make_policy
from policies.priors import cell_of

MATH = RequestFeatures(model="m", domain=Domain.MATH, temperature=0.0)


def _view(name: str, strategy: Strategy = Strategy.AR, inflight: int = 0, **kw) -> BackendView:
    return BackendView(
        spec=BackendSpec(name=name, url="http://x", model="m", strategy=strategy), inflight=inflight, **kw
    )


def _teach(
    policy: Goodput,
    backend: str,
    *,
    load: int,
    step_s: float,
    accept: float | None,
    domain: Domain = Domain.MATH,
    times: int = 20,
    tokens: int = 513,
) -> None:
    """Feed finished requests that saw `load` in flight, `step_s` per pass, `accept` per pass."""
    for _ in range(times):
        verify = round(tokens / accept) if accept else None
        policy.observe(
            Outcome(
                backend=backend,
                domain=domain,
                inflight_at_dispatch=load,
                completion_tokens=tokens,
                decode_s=(verify or tokens - 1) * step_s,
                verify_ct=verify,
                features=RequestFeatures(model="m", domain=domain, temperature=0.0),
            )
        )


def _crafted(objective: str = "latency") -> tuple[Goodput, BackendView, BackendView]:
    """A speculative backend accepting 4 tokens per pass at every load, whose step time grows
    from 40 ms alone to 400 ms at 32 in flight; an AR backend at a flat 38 ms."""
    policy = Goodput(objective, seed=1, epsilon=0.0)
    spec, ar = _view("spec", Strategy.DFLASH), _view("ar")
    policy.choose(MATH, [spec, ar])  # registers both
    _teach(policy, "spec", load=1, step_s=0.040, accept=4.0)
    _teach(policy, "spec", load=32, step_s=0.400, accept=4.0)
    _teach(policy, "ar", load=1, step_s=0.038, accept=None)
    _teach(policy, "ar", load=32, step_s=0.038, accept=None)
    return policy, spec, ar


def test_speculative_at_low_load_and_ar_at_high_load_with_acceptance_unchanged():
    policy, spec, ar = _crafted()
    est = policy.estimates.get("spec")
    assert est.accept_length(0) == pytest.approx(4.0, rel=0.02)  # same acceptance at both loads
    low = policy.choose(MATH, [spec, ar])
    assert low.backend.name == "spec" and low.score == pytest.approx(100, rel=0.05)
    spec.inflight = 31  # the request would be the 32nd
    high = policy.choose(MATH, [spec, ar])
    assert high.backend.name == "ar"
    assert high.score == pytest.approx(1 / 0.038, rel=0.05)
    assert "goodput/latency" in high.reason and "tok/s" in high.reason


def test_throughput_objective_flips_on_marginal_gain():
    policy, spec, ar = _crafted("throughput")
    assert policy.choose(MATH, [spec, ar]).backend.name == "spec"
    spec.inflight = 31  # one more sequence there adds less to the pool than one on AR
    assert policy.choose(MATH, [spec, ar]).backend.name == "ar"


def test_reported_load_counts_other_gateways_requests():
    policy, spec, ar = _crafted()
    spec.reported_running, spec.reported_waiting, spec.reported_inflight = 30, 1, 0
    assert policy.choose(MATH, [spec, ar]).backend.name == "ar"  # 31 on it, none of them ours
    spec.reported_inflight = 31  # all 31 were ours and have finished since the report
    assert policy.choose(MATH, [spec, ar]).backend.name == "spec"


def test_queueing_beyond_max_running_counts_against_a_backend():
    policy, spec, ar = _crafted()
    spec.max_running, spec.inflight = 2, 10  # 8 requests wait in its queue
    assert policy.choose(MATH, [spec, ar]).backend.name == "ar"


def _flips(hysteresis: float) -> int:
    """Two backends whose estimates cross back and forth by 2% (noise), equal loads."""
    policy = Goodput(seed=3, epsilon=0.0, bonus=0.0, hysteresis=hysteresis)
    a, b = _view("a", Strategy.EAGLE3), _view("b", Strategy.EAGLE3)
    chosen = []
    for i in range(40):
        fast, slow = ("a", "b") if i % 2 else ("b", "a")
        _teach(policy, fast, load=1, step_s=0.049, accept=3.0, times=3)
        _teach(policy, slow, load=1, step_s=0.051, accept=3.0, times=3)
        chosen.append(policy.choose(MATH, [a, b]).backend.name)
    return sum(x != y for x, y in itertools.pairwise(chosen))


def test_hysteresis_stops_flapping_between_near_equal_backends():
    assert _flips(0.0) > 20  # without it, every estimate wobble moves the traffic
    assert _flips(0.05) == 0


def test_hysteresis_does_not_stop_load_balancing_between_identical_backends():
    policy = Goodput(seed=0, epsilon=0.0)
    views = [_view("a"), _view("b")]
    for _ in range(10):
        chosen = policy.choose(MATH, views).backend
        chosen.inflight += 1
    assert [v.inflight for v in views] == [5, 5]


def test_a_clearly_better_challenger_wins_despite_hysteresis():
    policy, spec, ar = _crafted()
    spec.inflight = 31
    assert policy.choose(MATH, [spec, ar]).backend.name == "ar"  # AR is the incumbent now
    spec.inflight = 0
    assert policy.choose(MATH, [spec, ar]).backend.name == "spec"


def test_exact_ties_are_broken_at_random():
    # Identical AR backends at zero load: each decision is a fresh tie (loads never change);
    # hysteresis must not turn a tie into "always the first winner".
    views = [_view(n) for n in "abc"]
    policy = Goodput(seed=5, epsilon=0.0)
    counts = collections.Counter(policy.choose(MATH, views).backend.name for _ in range(3000))
    assert set(counts) == {"a", "b", "c"}
    assert all(800 < n < 1200 for n in counts.values()), counts


def test_exploration_keeps_every_competitive_backend_measured():
    policy = Goodput(seed=7, epsilon=0.05, explore_gap=20)
    views = [_view("dflash", Strategy.DFLASH), _view("eagle", Strategy.EAGLE3), _view("ddtree", Strategy.DDTREE)]
    chosen = collections.Counter()
    for _ in range(2000):
        d = policy.choose(MATH, views)
        chosen[d.backend.name] += 1
        accept = {"dflash": 5.0, "eagle": 3.2, "ddtree": 6.0}[d.backend.name]
        _teach(policy, d.backend.name, load=1, step_s=0.045, accept=accept, times=1)
    assert set(chosen) == {"dflash", "eagle", "ddtree"}
    assert chosen["ddtree"] > 0.85 * 2000  # exploration stays a small share
    assert all(e.observed > 0 for e in policy.estimates.backends.values())


def test_exploration_never_spends_a_request_on_a_hopeless_backend():
    policy = Goodput(seed=7, epsilon=0.5, explore_gap=0)  # explore as often as possible
    views = [_view("ddtree", Strategy.DDTREE), _view("ar")]
    names = {policy.choose(MATH, views).backend.name for _ in range(500)}
    assert names == {"ddtree"}  # AR is predicted ~6x slower: below explore_floor


def test_exploration_never_makes_a_request_twice_as_slow_to_spare_a_loaded_backend():
    # A DDTree backend holding 15 requests, where most of a new request's cost is what it does to
    # those 15, and an idle AR backend: within 2x of the best on cost, but more than 2x on this
    # request's own e2e. Exploring it would double that user's wait to measure a backend that is
    # not chosen on its merits.
    policy = Goodput(seed=3, epsilon=0.5, explore_gap=0)  # explore as often as possible
    fast, ar = _view("fast", Strategy.DDTREE, inflight=15), _view("ar")
    policy.choose(MATH, [fast, ar])  # registers both
    for load, step in ((1, 0.040), (8, 0.060), (16, 0.100), (32, 0.200)):
        _teach(policy, "fast", load=load, step_s=step, accept=6.0)
    _teach(policy, "ar", load=1, step_s=0.038, accept=None)
    out, cell = policy.lengths.expected(MATH), cell_of(0, 0.0, 0)
    est = policy.estimates.backends
    assert policy._cost(est["ar"], cell, 0, 0, out, ar, MATH) < 2 * policy._cost(
        est["fast"], cell, 15, 0, out, fast, MATH
    )
    own_ar = policy._cost(est["ar"], cell, 0, 0, out, ar, MATH, own_only=True)
    assert own_ar > 2 * policy._cost(est["fast"], cell, 15, 0, out, fast, MATH, own_only=True)
    assert {policy.choose(MATH, [fast, ar]).backend.name for _ in range(300)} == {"fast"}


def test_same_seed_same_decisions():
    def run(seed: int) -> list[str]:
        policy = Goodput(seed=seed, epsilon=0.2, explore_gap=0, explore_floor=0.0)
        views = [_view("a"), _view("b", Strategy.DFLASH), _view("c", Strategy.EAGLE3)]
        return [policy.choose(MATH, views).backend.name for _ in range(300)]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_describe_is_plain_json_for_the_admin_route():
    policy, spec, ar = _crafted()
    spec.inflight = 3
    snap = policy.describe([spec, ar])
    msgspec.json.encode(snap)  # plain data only
    b = snap["backends"]["spec"]
    assert b["strategy"] == "dflash" and b["load"] == 3
    assert set(b["accept_length"]) == {"math", "code", "chat"}
    assert b["predicted_tok_s"]["math"] > 0 and b["step_ms"]["1"] == pytest.approx(40, rel=0.05)
    assert snap["policy"]["objective"] == "latency" and snap["policy"]["telemetry_used"] == 80


def test_no_healthy_candidate_raises():
    policy = Goodput()
    with pytest.raises(NoCandidate):
        policy.choose(MATH, [_view("a", healthy=False)])
    with pytest.raises(NoCandidate):
        policy.choose(MATH, [])


def test_unhealthy_backends_are_never_chosen():
    policy = Goodput(seed=0, epsilon=0.5, explore_gap=0, explore_floor=0.0)
    views = [_view("a", Strategy.DDTREE, healthy=False), _view("b")]
    assert {policy.choose(MATH, views).backend.name for _ in range(200)} == {"b"}


# ------------------------------------------------------------------ threshold and registry


def test_threshold_speculative_below_n_ar_at_or_above():
    policy = make_policy("threshold", threshold=4, seed=0)
    spec, ar = _view("spec", Strategy.DFLASH, inflight=3), _view("ar", inflight=50)
    assert policy.choose(MATH, [spec, ar]).backend.name == "spec"
    spec.inflight = 4
    assert policy.choose(MATH, [spec, ar]).backend.name == "ar"
    spec.reported_running, spec.inflight = 10, 0  # the backend's own count says it is busy
    assert policy.choose(MATH, [spec, ar]).backend.name == "ar"


def test_threshold_spreads_over_speculative_backends_and_overflows_without_ar():
    policy = make_policy("threshold", threshold=2, seed=0)
    a, b = _view("a", Strategy.DFLASH, inflight=1), _view("b", Strategy.EAGLE3, inflight=0)
    assert policy.choose(MATH, [a, b]).backend.name == "b"
    a.inflight = b.inflight = 5
    assert policy.choose(MATH, [a, b]).backend.name in {"a", "b"}  # overflow: least loaded


def test_registry_builds_every_policy_and_refuses_unknown_options():
    from policies import POLICY_NAMES

    for name in POLICY_NAMES:
        opts = {"pinned_backend": "x"} if name == "pinned" else {}
        assert make_policy(name, **opts).name == name
    assert make_policy("goodput", objective="throughput", seed=1).objective == "throughput"
    assert make_policy("least_inflight", pinned_backend=None).name == "least_inflight"  # None = unset
    with pytest.raises(ValueError, match="objective"):
        make_policy("goodput", objective="fastest")
    with pytest.raises(ValueError, match="does not take"):
        make_policy("threshold", objective="latency")
    with pytest.raises(ValueError, match="threshold must be"):
        make_policy("threshold", threshold=0)


def _two(strategy):
    from backends import BackendSpec
    from policies import BackendView

    return [BackendView(spec=BackendSpec(name=n, url="http://x", model="m", strategy=strategy)) for n in "ab"]


def test_unmeasured_ar_backend_is_predicted_like_its_measured_ar_peer():
    """An AR backend whose prior is far from reality (here 50x slower than its measured AR peer,
    as with a time-scaled twin or a faster GPU) must not starve: two AR servers of one model
    differ only by hardware."""
    from backends import Strategy
    from policies import Domain, Outcome, RequestFeatures, make_policy

    views = _two(Strategy.AR)
    policy = make_policy("goodput", seed=1, epsilon=0.0)
    policy.choose(RequestFeatures(model="m"), views)
    for _ in range(5):  # b measured at 1300 tok/s; a never was
        policy.observe(
            Outcome(backend="b", domain=Domain.CHAT, inflight_at_dispatch=1, completion_tokens=40, decode_s=39 / 1300.0)
        )
    views[1].inflight = 3  # b is busier: a, equally fast by its peer, wins
    decision = policy.choose(RequestFeatures(model="m"), views)
    assert decision.backend.name == "a" and decision.score > 500  # its own prior says 26


def test_speculative_backends_of_one_strategy_do_not_stand_in_for_each_other():
    """DDTree budget 15 and 64 share a strategy but not a speed: a measured fast one says nothing
    about the unmeasured one, which keeps its own prior."""
    from backends import Strategy
    from policies import Domain, Outcome, RequestFeatures, make_policy

    views = _two(Strategy.DDTREE)
    policy = make_policy("goodput", seed=1, epsilon=0.0, bonus=0.0)
    policy.choose(RequestFeatures(model="m"), views)
    for _ in range(5):
        policy.observe(
            Outcome(
                backend="b",
                domain=Domain.MATH,
                inflight_at_dispatch=1,
                completion_tokens=100,
                decode_s=99 / 2000.0,
                verify_ct=7,
            )
        )
    prior_only = policy.estimates.get("a").rate(0, 1)
    assert policy.estimates.stand_in(policy.estimates.get("a")) is policy.estimates.get("a")
    assert policy.choose(RequestFeatures(model="m", domain=Domain.MATH), views).backend.name == "b"
    assert prior_only < 500


def test_slo_weight_trades_a_queued_long_prefill_for_the_busier_server():
    """A 50k-token prompt: server a is lightly loaded but 200k prompt tokens wait to be prefilled
    there; b runs 20 streams. The default weighs the 20 streams' stall more and queues the prompt
    on a (a TTFT far past the SLO); a high slo_weight prices that TTFT and sends it to b."""

    def views() -> list[BackendView]:
        def spec(n: str) -> BackendSpec:
            return BackendSpec(name=n, url="http://x", model="m", strategy=Strategy.DDTREE)

        return [
            BackendView(spec=spec("a"), inflight=4, pending_prefill=200_000, max_running=48),
            BackendView(spec=spec("b"), inflight=20, max_running=48),
        ]

    long_prompt = RequestFeatures(model="m", domain=Domain.CHAT, prompt_tokens=50_000, max_tokens=512)
    chosen = {
        w: make_policy("goodput", seed=0, epsilon=0.0, slo_weight=w).choose(long_prompt, views()).backend.spec.name
        for w in (1.0, 10.0)
    }
    assert chosen == {1.0: "a", 10.0: "b"}


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_a_request_of_many_sequences_is_priced_at_the_batch_it_makes(objective):
    """n = 16 on a backend that runs 8 at a time queues half of them; on a roomier one already
    running 2 it does not. One sequence is better off on the idle small one."""
    policy = Goodput(seed=0, epsilon=0.0, bonus=0.0, objective=objective)
    small = _view("small", Strategy.DFLASH, max_running=8)
    roomy = _view("roomy", Strategy.DFLASH, inflight=2, max_running=48)
    one = RequestFeatures(model="m", domain=Domain.MATH, prompt_tokens=200, max_tokens=256)
    sixteen = msgspec.structs.replace(one, sequences=16)
    assert policy.choose(one, [small, roomy]).backend.name == "small"
    d = policy.choose(sixteen, [small, roomy])
    assert d.backend.name == "roomy" and "at load 18" in d.reason
