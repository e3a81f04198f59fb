"""Parsers of what SGLang reports about itself, in the shapes of 0.5.23 and older 0.5.x, and the
windowed acceptance derived from them (backends/acceptance_window.py)."""

import pytest

from backends.acceptance_window import MIN_VERIFY_PASSES, AcceptanceWindow
from backends.loads import parse_get_load, parse_loads, parse_metrics, parse_server_info

V1_LOADS = {  # shape of sglang 0.5.23 python/sglang/srt/entrypoints/v1_loads.py, two DP ranks
    "timestamp": "2026-11-30T00:00:00+00:00",
    "version": "0.5.23",
    "accelerator": None,
    "num_accelerators": 8,
    "loads": [
        {
            "timestamp": 1.0,
            "dp_rank": 0,
            "num_running_reqs": 7,
            "num_waiting_reqs": 2,
            "max_running_requests": 48,
            "token_usage": 0.1,
            "speculative": {"accept_length": 4.0, "accept_rate": 0.4},
        },
        {
            "timestamp": 1.0,
            "dp_rank": 1,
            "num_running_reqs": 3,
            "num_waiting_reqs": 0,
            "max_running_requests": 48,
            "token_usage": 0.1,
            "speculative": {"accept_length": 5.0, "accept_rate": 0.5},
        },
    ],
}


def test_v1_loads_sums_ranks_and_keeps_the_lifetime_acceptance_apart():
    r = parse_loads(V1_LOADS)
    assert (r.running, r.waiting, r.max_running, r.lifetime_accept_length) == (10, 2, 96, 4.5)
    assert r.accept_length is None  # a lifetime average is not a windowed figure
    assert r.decode_moments is None  # not in this payload


def test_v1_loads_without_spec_section_has_no_acceptance():
    r = parse_loads({"loads": [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 0}]})
    assert r.running == 1 and r.lifetime_accept_length is None and r.max_running is None


def test_malformed_loads_give_none():
    for bad in [
        None,
        [],
        {},
        {"loads": []},
        {"loads": [{"num_running_reqs": "x", "num_waiting_reqs": 0}]},
        {"loads": ["x"]},
        {"loads": [{"num_running_reqs": True, "num_waiting_reqs": 0}]},
    ]:
        assert parse_loads(bad) is None


def test_get_load_of_older_releases():
    # sglang 0.5.9 io_struct.GetLoadReqOutput: num_reqs = running + waiting
    r = parse_get_load([{"dp_rank": 0, "num_reqs": 9, "num_waiting_reqs": 2, "num_tokens": 500, "ts_tic": 1.0}])
    assert (r.running, r.waiting, r.token_load) == (7, 2, 500)
    assert parse_get_load({"load": 1234}).token_load == 1234  # 0.5.2
    assert parse_get_load({"load": 1234}).running is None
    assert parse_get_load([{"load": 1}, {"load": 2}]).token_load == 3
    assert parse_get_load({"nope": 1}) is None


def test_metrics_accepts_both_prefixes():
    text = (
        '# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{model_name="m",dp_rank="0"} 5.0\n'
        'sglang_num_running_reqs{dp_rank="1"} 2\nsglang:num_queue_reqs{model_name="m"} 3.0\n'
        'sglang:spec_accept_length{model_name="m"} 3.5\n'
    )
    r = parse_metrics(text)
    assert (r.running, r.waiting, r.accept_length, r.accept_source) == (7, 3, 3.5, "metrics gauge")
    assert parse_metrics("python_gc_objects_collected_total 1\n") is None


def test_nan_and_infinite_values_are_no_figures():
    """Prometheus text allows NaN and +Inf; neither is a count or an accept length. They used to
    raise from int(), which ended the backend's polling for good."""
    text = (
        'sglang:num_running_reqs{dp_rank="0"} 4\nsglang:num_running_reqs{dp_rank="1"} NaN\n'
        'sglang:num_queue_reqs +Inf\nsglang:spec_accept_length{dp_rank="0"} +Inf\n'
    )
    r = parse_metrics(text)
    assert r is not None and (r.running, r.waiting, r.accept_length) == (4, 0, None)
    assert parse_metrics("sglang:num_running_reqs NaN\n") is None
    rank = {"dp_rank": 0, "num_running_reqs": float("nan"), "num_waiting_reqs": 0}
    assert parse_loads({"loads": [rank]}) is None
    assert parse_server_info({"max_running_requests": float("inf")}).max_running_requests is None


def test_server_info():
    info = parse_server_info(
        {
            "speculative_algorithm": "DFLASH",
            "max_running_requests": 48,
            "served_model_name": "kimi-k2.6",
            "version": "0.5.23",
            "internal_states": [{"avg_spec_accept_length": 4.2}],
        }
    )
    assert (info.speculative_algorithm, info.max_running_requests, info.avg_spec_accept_length) == ("DFLASH", 48, 4.2)
    assert not info.enable_metrics
    assert parse_server_info({"enable_metrics": True}).enable_metrics
    ar = parse_server_info({"speculative_algorithm": None, "max_running_requests": 256, "internal_states": []})
    assert ar.speculative_algorithm is None and ar.avg_spec_accept_length is None
    assert parse_server_info("nope") is None
    assert ar.priority_order is None  # SGLang's default: no priority scheduling
    on = {"enable_priority_scheduling": True}
    assert parse_server_info(on).priority_order == "high_first"
    assert parse_server_info({**on, "schedule_low_priority_values_first": True}).priority_order == "low_first"
    assert parse_server_info({"schedule_low_priority_values_first": True}).priority_order is None


def _rank(moments, accept=None, kv=100_000):
    """One DP rank of SGLang 0.5.23's /v1/loads: decode_moments = [steps, sum batch, sum step us,
    sum batch^2, sum batch*us, sum generated] (scheduler.py::_accumulate_decode_moment)."""
    rank = {
        "dp_rank": 0,
        "num_running_reqs": 4,
        "num_waiting_reqs": 0,
        "max_running_requests": 48,
        "max_total_num_tokens": kv,
        "decode_moments": moments,
    }
    if accept is not None:
        rank["speculative"] = {"accept_length": accept, "accept_rate": 0.5}
    return rank


def _moments(passes: float, generated: float) -> list[float]:
    return [passes / 4, passes, passes * 10_000.0, passes * 4, passes * 40_000.0, generated]


def test_decode_moments_are_summed_over_ranks_and_kv_budgets_too():
    r = parse_loads({"loads": [_rank(_moments(100, 400)), _rank(_moments(50, 100))]})
    assert r.decode_moments[1] == 150 and r.decode_moments[5] == 500 and r.max_total_tokens == 200_000
    partial = parse_loads({"loads": [_rank(_moments(100, 400)), _rank(None)]})
    assert partial.decode_moments is None  # one rank without them: no sum that means anything


def test_the_window_follows_a_collapse_the_lifetime_average_hides():
    """A day at 4.0 tokens per pass, then the drafter collapses to 1.5: the lifetime average
    barely moves; the window says 1.5 at once."""
    window = AcceptanceWindow()
    passes, generated = 1_000_000.0, 4_000_000.0

    def lifetime():
        return generated / passes

    assert window.update(parse_loads({"loads": [_rank(_moments(passes, generated), lifetime())]})) is None
    for _ in range(5):
        passes, generated = passes + 2_000, generated + 2_000 * 1.5
        report = parse_loads({"loads": [_rank(_moments(passes, generated), lifetime())]})
        assert window.update(report) == pytest.approx(1.5)
    assert report.lifetime_accept_length > 3.95  # what a router reading /v1/loads as-is would see
    assert window.source == "decode moments"


def test_a_window_closes_only_with_enough_passes_and_an_idle_backend_keeps_its_last():
    window = AcceptanceWindow()
    window.update(parse_loads({"loads": [_rank(_moments(1000, 3000))]}))
    window.update(parse_loads({"loads": [_rank(_moments(1000 + MIN_VERIFY_PASSES // 2, 3000 + 20 * 2))]}))
    assert window.value is None  # too few passes yet: they carry over to the next poll
    window.update(parse_loads({"loads": [_rank(_moments(1000 + MIN_VERIFY_PASSES, 3000 + MIN_VERIFY_PASSES * 2))]}))
    assert window.value == pytest.approx(2.0)
    window.update(parse_loads({"loads": [_rank(_moments(1000 + MIN_VERIFY_PASSES, 3000 + MIN_VERIFY_PASSES * 2))]}))
    assert window.value == pytest.approx(2.0)  # idle: the last window stands, as SGLang's gauge does


def test_a_restarted_server_starts_a_new_window():
    window = AcceptanceWindow()
    window.update(parse_loads({"loads": [_rank(_moments(10_000, 30_000))]}))
    window.update(parse_loads({"loads": [_rank(_moments(10_100, 30_300))]}))
    assert window.value == pytest.approx(3.0)
    window.update(parse_loads({"loads": [_rank(_moments(50, 250))]}))  # counters went back: a restart
    window.update(parse_loads({"loads": [_rank(_moments(150, 350))]}))
    assert window.value == pytest.approx(1.0)


def test_the_metrics_gauge_wins_and_nothing_windowed_comes_from_a_lifetime_average_alone():
    window = AcceptanceWindow()
    assert window.update(parse_loads({"loads": [_rank(_moments(100, 300))]}), gauge=2.5) == 2.5
    assert window.source == "metrics gauge"
    lifetime_only = AcceptanceWindow()
    for accept in (4.0, 3.9, 3.8):  # an older server: lifetime average, no decode moments, no metrics
        assert lifetime_only.update(parse_loads({"loads": [_rank(None, accept)]})) is None


# ---- on twins that report the way SGLang 0.5.23 does ---------------------------------------------


def test_a_restart_between_two_reports_is_told_by_counters_that_went_back():
    before = parse_loads({"loads": [_rank(_moments(10_000, 30_000))]})
    later = parse_loads({"loads": [_rank(_moments(10_100, 30_300))]})
    restarted = parse_loads({"loads": [_rank(_moments(50, 250))]})
    assert before is not None and later is not None and restarted is not None
    assert not later.restarted_since(before) and not before.restarted_since(before)
    assert restarted.restarted_since(later)
    old = parse_get_load([{"num_reqs": 3, "num_waiting_reqs": 1, "num_tokens": 900}])  # no counters: no verdict
    assert old is not None and not old.restarted_since(later) and not later.restarted_since(old)
