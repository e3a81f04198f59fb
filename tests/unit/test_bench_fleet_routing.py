"""bench.fleet_routing's verdicts: which metric the 1.15x target holds on, the tails against that
baseline, every single strategy, and the bound printed when the target misses."""

from bench.fleet_routing import Row, cases, judge
from evaluate.metrics import PhaseMetrics
from evaluate.scenarios import SCENARIOS


def _m(tok_s: float, good: float, ttft_p99_s: float = 10.0, e2e_p99_s: float = 60.0) -> PhaseMetrics:
    return PhaseMetrics(
        aggregate_tok_s=0.0,
        mean_request_tok_s=tok_s,
        p50_request_tok_s=tok_s,
        p99_ttft_ms=ttft_p99_s * 1000,
        p99_e2e_s=e2e_p99_s,
        backend_share={},
        requests=100,
        goodput_rps=good,
        slo_attainment=0.9,
    )


def _homog() -> dict[str, list[Row]]:
    return {
        "4xk26-dflash": [
            Row(fleet="4xk26-dflash", policy="sglang/cache_aware", m=_m(60.0, 1.00)),
            Row(fleet="4xk26-dflash", policy="sglang/round_robin", m=_m(62.0, 0.90)),
        ],
        "4xk26-ar": [Row(fleet="4xk26-ar", policy="sglang/cache_aware", m=_m(20.0, 0.50))],
    }


def _verdicts(mine: PhaseMetrics) -> list:
    scenario = SCENARIOS["agentic"]
    _, targets = judge("agentic", "load-90", Row(fleet="plan", policy="specroute", m=mine), _homog(), scenario, 0.5)
    return targets


def test_the_target_holds_on_goodput_against_the_best_pair_for_that_metric():
    speed, tails, singles = _verdicts(_m(61.0, 1.20, ttft_p99_s=9.0, e2e_p99_s=50.0))
    assert speed.holds and "goodput_rps" in speed.value and "cache_aware" in speed.value
    assert tails.holds and singles.holds


def test_a_miss_names_both_ratios_and_prints_the_bound():
    targets = _verdicts(_m(61.0, 1.05, ttft_p99_s=12.0))
    speed, tails, singles, bound = targets
    assert not speed.holds and len(speed.detail) == 2
    assert "round_robin" in speed.detail[1]  # the best on request tok/s is another policy
    assert not tails.holds  # TTFT p99 12 s against 10 s
    assert singles.holds and bound.holds is None and "bound" in bound.name


def test_below_a_single_strategy_fails():
    *_, singles, _bound = _verdicts(_m(50.0, 0.95))
    assert not singles.holds and "4xk26-dflash" in singles.value


def test_cases_cover_a_light_and_a_near_capacity_trace_load_and_the_agentic_shape():
    from bench.fleet_routing import SLICE

    labels = [c.label for c in cases(SLICE, 1.5)]
    assert labels == ["mooncake 0.25x", "mooncake 0.375x", "agentic"]
