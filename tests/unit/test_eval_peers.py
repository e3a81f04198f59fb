"""SGLang's router's policies as eval baselines, and the open-loop simulator that runs them."""

import msgspec
import pytest

from backends import BackendSpec, Strategy
from evaluate.peers import CacheAware, LeastLoad, LoadSnapshot, PowerOfTwo, RoundRobinPeer, make_peer
from evaluate.runner import run_scenario
from evaluate.scenarios import Phase, Scenario
from evaluate.sim import simulate
from evaluate.workload import Mix
from policies.base import BackendView, Domain, RequestFeatures


def _views(*loads: int) -> list[BackendView]:
    return [
        BackendView(spec=BackendSpec(name=f"w{i}", url=f"sim://w{i}", model="m", strategy=Strategy.AR), inflight=n)
        for i, n in enumerate(loads)
    ]


def _req(chain: tuple[int, ...], prompt_tokens: int) -> RequestFeatures:
    return RequestFeatures(model="m", domain=Domain.CHAT, prompt_tokens=prompt_tokens, prefix=chain)


def test_cache_aware_keeps_a_conversation_where_its_prefix_was_sent():
    p = CacheAware()
    views = _views(0, 0, 0)
    first = p.choose(_req((1, 2, 3), 250), views).backend.name
    views[[v.name for v in views].index(first)].inflight = 3  # it got busier, still balanced (< 64 apart)
    # the next turn extends the chain: 3 of its 5 blocks are in `first`'s tree (3 * 64 / 330 > 0.3)
    assert p.choose(_req((1, 2, 3, 4, 5), 330), views).backend.name == first
    # a fresh prompt matches nothing: the least loaded worker
    assert p.choose(_req((9, 8), 200), views).backend.name != first


def test_cache_aware_balances_when_loads_are_far_apart():
    p = CacheAware()
    views = _views(0, 0)
    owner = p.choose(_req((71, 72, 73), 200), views).backend.name
    views[[v.name for v in views].index(owner)].inflight = 100  # 100 - 0 > 64 and 100 > 1.5 * 0
    other = p.choose(_req((71, 72, 73, 74), 260), views).backend.name
    assert other != owner
    # with a small imbalance the cache decides again: the longest recorded prefix, which the
    # imbalanced choice recorded on the other worker (SGLang inserts it in either mode)
    views[[v.name for v in views].index(owner)].inflight = 50
    assert p.choose(_req((71, 72, 73, 74, 75), 330), views).backend.name == other
    assert p.choose(_req((71, 72, 99), 200), views).backend.name in (owner, other)


def test_cache_aware_trees_stay_bounded():
    p = CacheAware(max_tree_size=64 * 4 * 100)  # 100 blocks per worker
    views = _views(0)
    for k in range(50):
        p.choose(_req(tuple(range(k * 10, k * 10 + 10)), 640), views)
    assert len(p._trees["w0"].blocks) == 100


def test_power_of_two_prefers_the_lower_token_load_and_falls_back_to_counts():
    p = PowerOfTwo(seed=1)
    views = _views(5, 5)
    p.update_loads(
        {
            "w0": LoadSnapshot(num_used_tokens=100, token_usage=0.1, gen_throughput=1.0, num_waiting_uncached_tokens=0),
            "w1": LoadSnapshot(
                num_used_tokens=90000, token_usage=0.9, gen_throughput=1.0, num_waiting_uncached_tokens=0
            ),
        }
    )
    assert all(p.choose(_req((), 10), views).backend.name == "w0" for _ in range(20))
    p.update_loads(
        {"w0": LoadSnapshot(num_used_tokens=100, token_usage=0.1, gen_throughput=1.0, num_waiting_uncached_tokens=0)}
    )
    views[0].inflight = 9  # w1 has no token report: both compared on in-flight counts
    assert all(p.choose(_req((), 10), views).backend.name == "w1" for _ in range(20))


def test_least_load_drains_the_queue_fastest_and_credits_its_own_dispatches():
    p = LeastLoad()
    views = _views(0, 0)
    snap = dict(token_usage=0.2, num_used_tokens=0)
    p.update_loads(
        {
            "w0": LoadSnapshot(gen_throughput=1000.0, num_waiting_uncached_tokens=4000, **snap),
            "w1": LoadSnapshot(gen_throughput=4000.0, num_waiting_uncached_tokens=4000, **snap),
        }
    )
    assert p.choose(_req((), 10), views).backend.name == "w1"  # 1 s of queue vs 4 s
    # each dispatch adds 1024 tokens to w1's since-poll work: after a few, w0 drains sooner
    picks = [p.choose(_req((), 10), views).backend.name for _ in range(12)]
    assert "w0" in picks
    assert p.choose(_req((), 10), _views(0)).backend.name == "w0"  # one worker: no scoring


def test_round_robin_cycles_and_unknown_peers_are_refused():
    p = RoundRobinPeer()
    views = _views(0, 0, 0)
    assert [p.choose(_req((), 1), views).backend.name for _ in range(4)] == ["w0", "w1", "w2", "w0"]
    with pytest.raises(ValueError, match="unknown SGLang router policy"):
        make_peer("sglang/fastest")


OPEN = Scenario(
    name="open-tiny",
    description="",
    pool=("k26-dflash", "k26-ddtree:b=8"),
    max_queued=2,
    phases=(
        Phase(
            name="busy",
            duration_s=60.0,
            arrival="poisson",
            load=0.9,
            domains={"math": 1.0, "chat": 1.0},
            mix=Mix(chat=0.6, thinking=0.3, temperatures=((0.0, 1.0), (1.0, 1.0)), turns=(2, 3), think_s=2.0),
        ),
    ),
    min_tokens=64,
    max_tokens=128,
)


def test_open_loop_runs_count_shed_requests_as_slo_misses_and_feed_the_gateways_features():
    seen = []

    class Spy:
        name = "spy"

        def __init__(self):
            self.inner = make_peer("sglang/round_robin")

        def choose(self, request, candidates):
            seen.append(request)
            return self.inner.choose(request, candidates)

        def observe(self, outcome):
            seen.append(outcome)

    run = simulate(OPEN, lambda e, s: Spy(), seed=0, phase_rates=[40.0])  # far beyond two servers
    feats = [x for x in seen if isinstance(x, RequestFeatures)]
    outs = [x for x in seen if not isinstance(x, RequestFeatures)]
    assert any(f.prefix for f in feats) and {f.temperature for f in feats} == {0.0, 1.0}
    assert any(f.max_tokens is None for f in feats)  # realistic clients send no max_tokens
    assert any(o.error == "queue_full" for o in outs)
    done = [o for o in outs if o.error is None]
    assert any(o.cached_tokens for o in done) and all(o.features is not None for o in done)
    shed = [r for r in run.failed if r.status == "shed"]
    assert shed and all(r.retried for r in shed)
    from evaluate.metrics import phase_metrics

    (m,) = phase_metrics(run, OPEN, ["k26-dflash", "k26-ddtree:b=8"])
    assert m.shed > 0 and m.arrived >= m.requests + m.shed + m.unfinished
    assert m.slo_attainment <= (m.arrived - m.shed) / m.arrived


def test_open_loop_scenario_reports_peers_statics_and_the_clairvoyants():
    scen = msgspec.structs.replace(OPEN, max_queued=None)
    res = run_scenario(
        scen,
        seed=0,
        objectives=("latency",),
        only=("goodput/latency", "sglang/cache_aware", "least_inflight", "static/k26-dflash", "clairvoyant/e2e"),
    )
    (ph,) = res.phases
    assert ph.rate_rps > 0 and ph.arrival == "poisson"
    assert set(ph.policies) == {
        "goodput/latency",
        "sglang/cache_aware",
        "least_inflight",
        "static/k26-dflash",
        "clairvoyant/e2e",
        "clairvoyant/latency",
    }
    for key, m in ph.policies.items():
        assert m.arrived > 0 and m.p99_ttft_ms >= m.p50_ttft_ms and m.p99_e2e_s >= m.p50_e2e_s, key
        assert 0.0 <= m.slo_attainment <= 1.0 and m.goodput_rps >= 0.0, key
    # the static backend is judged on the fleet's sessions: two of it, each alone with half of them
    static, fleet = ph.policies["static/k26-dflash"], ph.policies["least_inflight"]
    assert abs(static.arrived - fleet.arrived) < 0.1 * fleet.arrived
    assert res.summary["goodput/latency"]["hindsight_regret"] == pytest.approx(
        1
        - res.summary["goodput/latency"]["phase_mean_request_tok_s"]
        / res.summary["static/k26-dflash"]["phase_mean_request_tok_s"]
    )
    assert "goodput/latency" in res.cold_start


def test_shares_of_an_open_loop_split_its_sessions_each_to_exactly_one_part():
    def first_turns(run):
        return [(r.session, r.t_send) for r in (*run.records, *run.failed) if r.turn == 0]

    router = lambda e, s: make_peer("sglang/round_robin")  # noqa: E731
    whole = first_turns(simulate(OPEN, router, seed=3, phase_rates=[4.0]))
    parts = [first_turns(simulate(OPEN, router, seed=3, phase_rates=[4.0], share=(k, 3))) for k in range(3)]
    assert all(parts) and sorted(x for p in parts for x in p) == sorted(whole)
    with pytest.raises(ValueError, match="share"):
        simulate(OPEN, router, seed=3, share=(3, 3))
