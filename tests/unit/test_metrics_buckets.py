"""The latency histograms reach past what the config allows a request (gateway.metrics.latency_buckets),
every finished request is recorded with its endpoint and error type, and the error types stay a
bounded set. Unit tests: they run on the dependency floors too."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ConfigError, config_from_dict
from gateway.metrics import MAX_ERROR_TYPES, OTHER_ERROR, GatewayMetrics, latency_buckets
from gateway.records import RequestRecord

BACKENDS = [{"name": "a", "url": "http://127.0.0.1:9", "model": "m"}]


def _record(**fields) -> RequestRecord:
    base = {"request_id": "r", "model": "m", "kind": "chat", "stream": True, "status": 200, "duration_s": 1.0}
    return RequestRecord(**{**base, **fields})


def _families(metrics: GatewayMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def _bucket_of(metrics: GatewayMetrics, family: str) -> str:
    """The `le` of the lowest bucket that counted the one observation made."""
    samples = [s for s in _families(metrics)[family].samples if s.name.endswith("_bucket") and s.value]
    return min(samples, key=lambda s: float(s.labels["le"])).labels["le"]


def test_a_thinking_answer_lands_in_a_finite_bucket_with_the_default_timeouts():
    buckets = latency_buckets(config_from_dict({"backends": BACKENDS}))
    assert buckets.ttft[-1] >= 300 + 30  # first_byte_s after queue_timeout_s in the queue
    assert buckets.duration[-1] >= 900  # request_s, and at least 900 s for a stream
    assert buckets.duration[:14] == (
        0.01,
        0.02,
        0.04,
        0.08,
        0.16,
        0.32,
        0.64,
        1.28,
        2.56,
        5.12,
        10.24,
        20.48,
        40.96,
        81.92,
    )
    metrics = GatewayMetrics(buckets)
    # 4k tokens of K2.6 thinking at 26 tok/s: 157 s, its first token 12 s in (queued and prefilled)
    metrics.observe(_record(backend="a", duration_s=157.0, ttft_s=12.0))
    assert _bucket_of(metrics, "specroute_request_duration_seconds") == "163.84"
    assert _bucket_of(metrics, "specroute_ttft_seconds") == "20.0"
    assert _bucket_of(metrics, "gen_ai_client_operation_duration_seconds") == "163.84"


def test_buckets_follow_the_timeouts_or_the_metrics_section():
    config = config_from_dict(
        {
            "timeouts": {"request_s": 3000, "first_byte_s": 600},
            "admission": {"queue_timeout_s": 90},
            "backends": BACKENDS,
        }
    )
    buckets = latency_buckets(config)
    assert buckets.duration[-1] >= 3000 and buckets.duration[-2] < 3000
    assert buckets.ttft[-1] >= 690 and buckets.queue[-1] >= 90
    own = config_from_dict(
        {"metrics": {"ttft_buckets_s": [0.5, 5, 50], "duration_buckets_s": [1, 10, 100, 7200]}, "backends": BACKENDS}
    )
    assert latency_buckets(own)[:2] == ((0.5, 5.0, 50.0), (1.0, 10.0, 100.0, 7200.0))
    for bad, why in (
        ([10, 5], "ascending"),
        ([0, 1], "finite bounds > 0"),
        ([float("inf")], "finite bounds > 0"),
        (list(range(1, 70)), "at most 64"),
    ):
        with pytest.raises(ConfigError, match=f"metrics.duration_buckets_s: expected .*{why}"):
            config_from_dict({"metrics": {"duration_buckets_s": bad}, "backends": BACKENDS})


def test_every_request_is_recorded_with_its_endpoint_and_error_type():
    metrics = GatewayMetrics()
    metrics.observe(_record(backend="a", kind="completion"))
    metrics.observe(_record(kind="responses", status=404, error_type="not_found_error"))
    metrics.observe(_record(backend="a", status=200, error_type="broken_stream"))  # a stream cut after its 200
    metrics.observe(_record(status=499))  # no error type said: the status stands for it
    requests = {
        (s.labels["endpoint"], s.labels["status"], s.labels["error_type"]): s.value
        for s in _families(metrics)["specroute_requests"].samples
        if s.name.endswith("_total")
    }
    assert requests == {
        ("completions", "200", ""): 1,
        ("responses", "404", "not_found_error"): 1,
        ("chat", "200", "broken_stream"): 1,
        ("chat", "499", "499"): 1,
    }
    durations = [
        s for s in _families(metrics)["specroute_request_duration_seconds"].samples if s.name.endswith("_count")
    ]
    assert sum(s.value for s in durations) == 4


def test_error_types_are_a_bounded_set():
    metrics = GatewayMetrics()
    for i in range(MAX_ERROR_TYPES + 8):
        metrics.observe(_record(status=502, error_type=f"UpstreamError{i}"))
    metrics.observe(_record(status=502, error_type="what an upstream said, with spaces"))
    metrics.observe(_record(status=502, error_type="UpstreamError0"))  # one already seen stays itself
    types = {
        s.labels["error_type"]: s.value
        for s in _families(metrics)["specroute_requests"].samples
        if s.name.endswith("_total")
    }
    assert len(types) == MAX_ERROR_TYPES + 1
    assert types[OTHER_ERROR] == 9 and types["UpstreamError0"] == 2
