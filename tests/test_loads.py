"""Parsers of what SGLang reports about itself, in the shapes of 0.5.23 and older 0.5.x."""

from backends.loads import parse_get_load, parse_loads, parse_metrics, parse_server_info

V1_LOADS = {  # shape of sglang 0.5.23 python/sglang/srt/entrypoints/v1_loads.py, two DP ranks
    "timestamp": "2026-11-30T00:00:00+00:00", "version": "0.5.23", "accelerator": None, "num_accelerators": 8,
    "loads": [
        {"timestamp": 1.0, "dp_rank": 0, "num_running_reqs": 7, "num_waiting_reqs": 2, "max_running_requests": 48,
         "token_usage": 0.1, "speculative": {"accept_length": 4.0, "accept_rate": 0.4}},
        {"timestamp": 1.0, "dp_rank": 1, "num_running_reqs": 3, "num_waiting_reqs": 0, "max_running_requests": 48,
         "token_usage": 0.1, "speculative": {"accept_length": 5.0, "accept_rate": 0.5}},
    ],
}


def test_v1_loads_sums_ranks_and_averages_acceptance():
    r = parse_loads(V1_LOADS)
    assert (r.running, r.waiting, r.max_running, r.accept_length) == (10, 2, 96, 4.5)


def test_v1_loads_without_spec_section_has_no_acceptance():
    r = parse_loads({"loads": [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 0}]})
    assert r.running == 1 and r.accept_length is None and r.max_running is None


def test_malformed_loads_give_none():
    for bad in [None, [], {}, {"loads": []}, {"loads": [{"num_running_reqs": "x", "num_waiting_reqs": 0}]},
                {"loads": ["x"]}, {"loads": [{"num_running_reqs": True, "num_waiting_reqs": 0}]}]:
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
    text = ('# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{model_name="m",dp_rank="0"} 5.0\n'
            'sglang_num_running_reqs{dp_rank="1"} 2\nsglang:num_queue_reqs{model_name="m"} 3.0\n'
            'sglang:spec_accept_length{model_name="m"} 3.5\n')
    r = parse_metrics(text)
    assert (r.running, r.waiting, r.accept_length) == (7, 3, 3.5)
    assert parse_metrics("python_gc_objects_collected_total 1\n") is None


def test_server_info():
    info = parse_server_info({"speculative_algorithm": "DFLASH", "max_running_requests": 48,
                              "served_model_name": "kimi-k2.6", "version": "0.5.23",
                              "internal_states": [{"avg_spec_accept_length": 4.2}]})
    assert (info.speculative_algorithm, info.max_running_requests, info.avg_spec_accept_length) == ("DFLASH", 48, 4.2)
    ar = parse_server_info({"speculative_algorithm": None, "max_running_requests": 256, "internal_states": []})
    assert ar.speculative_algorithm is None and ar.avg_spec_accept_length is None
    assert parse_server_info("nope") is None
