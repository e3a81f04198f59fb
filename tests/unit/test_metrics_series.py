"""/metrics series of a backend that left the pool go with it (GatewayMetrics.forget_backend); a
unit test, so it runs on the dependency floors too (prometheus-client's `remove_by_labels`)."""

from __future__ import annotations

from gateway.metrics import GatewayMetrics
from gateway.records import RequestRecord


def _served(backend: str) -> RequestRecord:
    return RequestRecord(
        request_id=f"r-{backend}",
        model="kimi-k2.6",
        kind="chat",
        stream=True,
        status=200,
        duration_s=1.0,
        backend=backend,
        domain="math",
        ttft_s=0.1,
        tpot_s=0.01,
        decode_tok_s=100.0,
        accept_length=3.0,
        speedup=2.0,
        prompt_tokens=10,
        completion_tokens=90,
    )


def test_a_departed_backend_takes_every_series_it_had_and_leaves_the_others():
    metrics = GatewayMetrics()
    for name in ("a", "b"):
        metrics.observe(_served(name))
        metrics.decision("kimi-k2.6", "goodput", name)
        metrics.upstream_errors.labels(name, "lost").inc()
    before = metrics.render().decode()
    assert 'backend="b"' in before and 'backend="a"' in before
    metrics.forget_backend("b")
    after = metrics.render().decode()
    assert 'backend="b"' not in after
    kept = [line for line in before.splitlines() if 'backend="a"' in line]
    assert kept and all(line in after for line in kept)
    # a name that comes back starts its series afresh
    metrics.observe(_served("b"))
    assert (
        'specroute_requests_total{backend="b",endpoint="chat",error_type="",model="kimi-k2.6",status="200"} 1.0'
        in metrics.render().decode()
    )
