"""Trace context and sampling as the gateway does them by hand, checked against the OpenTelemetry SDK,
and the span records the exporter turns into spans (the exporter as a process, its bounds and
shutdown: tests/integration/test_tracing_export.py)."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from gateway.config import TracingSection
from gateway.records import RequestRecord
from gateway.sampling import sampler_from
from gateway.tracing import Tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 0.999, 1.0])
def test_ratio_sampling_matches_the_sdk_bit_for_bit(ratio, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", str(ratio))
    ours, sdk = sampler_from(None), ParentBased(TraceIdRatioBased(ratio))
    rng = random.Random(7)
    for _ in range(3000):
        trace_id = rng.getrandbits(128)
        assert ours.sampled(trace_id, None) == sdk.should_sample(None, trace_id, "x").decision.is_sampled()


def test_sampler_names_and_parent_rules(monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    assert sampler_from(None).name == "parentbased_always_on"
    config_ratio = sampler_from(0.25)
    assert config_ratio.name == "parentbased_traceidratio" and config_ratio.bound == 1 << 62
    assert config_ratio.sampled(1, False) is False and config_ratio.sampled(2**64 - 1, True) is True
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    never = sampler_from(0.9)  # the environment wins over the config file
    assert never.sampled(0, True) is False  # not parent-based: the parent's flag does not matter
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "not-a-number")
    assert sampler_from(None).sampled(2**64 - 1, False) is True  # bad ratio -> 1.0, as the SDK does
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "jaeger_remote")
    assert sampler_from(None).name == "parentbased_always_on"


@pytest.mark.parametrize(
    "header, honoured",
    [
        (f"00-{TRACE}-{PARENT}-01", True),
        (f"  00-{TRACE}-{PARENT}-01  ", True),
        (f"01-{TRACE}-{PARENT}-01-future-field", True),  # a later version may add fields
        (f"00-{TRACE}-{PARENT}-01-extra", False),  # version 00 may not
        (f"ff-{TRACE}-{PARENT}-01", False),  # version ff is invalid
        (f"00-{'0' * 32}-{PARENT}-01", False),  # all-zero trace id
        (f"00-{TRACE}-{'0' * 16}-01", False),  # all-zero parent id
        (f"00-{TRACE.upper()}-{PARENT}-01", False),  # upper case hex
        ("garbage", False),
    ],
)
def test_traceparent_parsing_follows_w3c(header, honoured):
    tracing = Tracing(TracingSection(), exporter=InMemorySpanExporter())
    try:
        span = tracing.start_server_span(header, "vendor=x")
        assert (span.trace_id == TRACE and span.parent_id == PARENT) is honoured
        assert span.trace_state == ("vendor=x" if honoured else None)
        assert len(span.trace_id) == 32 and len(span.span_id) == 16
    finally:
        tracing.shutdown()


def test_a_new_trace_has_fresh_ids_and_its_server_span_is_the_trace_ids_low_half():
    """B3's root-span convention: the SERVER span of a new trace takes the trace id's low 64 bits."""
    tracing = Tracing(TracingSection(), exporter=InMemorySpanExporter())
    try:
        traces = [tracing.start_server_span(None, None) for _ in range(200)]
        assert len({t.trace_id for t in traces}) == 200
        assert all(len(t.trace_id) == 32 and int(t.trace_id, 16) and t.span_id == t.trace_id[16:] for t in traces)
        assert all(t.sampled and t.start_ns and t.parent_id is None for t in traces)
        joined = tracing.start_server_span(f"00-{TRACE}-{PARENT}-01", None)  # a remote parent: a random span id
        assert joined.trace_id == TRACE and joined.span_id not in (TRACE[16:], PARENT) and len(joined.span_id) == 16
    finally:
        tracing.shutdown()


def test_a_client_span_ending_after_its_server_span_is_exported_alone_under_it():
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    try:
        trace = tracing.start_server_span(None, None)
        headers: dict[str, str] = {}
        span = tracing.start_client_span(trace, ("10.0.0.7", 30000), headers)
        tracing.end_server_span(trace, "POST", "/v1/chat/completions", 200)  # e.g. a stream cut by the client
        tracing.end_client_span(
            span,
            RequestRecord(
                request_id="r",
                model="m",
                kind="completion",
                stream=True,
                status=499,
                duration_s=0.1,
                error="client gone",
                error_type="cancelled",
            ),
        )
        assert tracing.force_flush()
        spans = {s.kind: s for s in exporter.get_finished_spans()}
        assert len(exporter.get_finished_spans()) == 2
    finally:
        tracing.shutdown()
    server, client = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert headers["traceparent"] == f"00-{trace.trace_id}-{client.context.span_id:016x}-01"
    assert client.parent.span_id == server.context.span_id and client.context.trace_id == server.context.trace_id
    assert client.name == "text_completion m" and client.attributes["server.address"] == "10.0.0.7"
    assert client.attributes["error.type"] == "cancelled" and client.status.description == "client gone"
    assert server.name == "POST /v1/chat/completions" and server.attributes["http.response.status_code"] == 200


def test_unsampled_parent_records_nothing_but_propagates_context():
    tracing = Tracing(TracingSection(), exporter=InMemorySpanExporter())
    try:
        span = tracing.start_server_span(f"00-{TRACE}-{PARENT}-00", None)
        assert not span.sampled and span.trace_id == TRACE
    finally:
        tracing.shutdown()


def test_configure_swaps_the_sampler_and_keeps_the_exporter(caplog):
    tracing = Tracing(TracingSection(sample_ratio=0.0), exporter=InMemorySpanExporter())
    try:
        assert not tracing.start_server_span(None, None).sampled
        tracing.configure(TracingSection(sample_ratio=1.0))
        assert tracing.start_server_span(None, None).sampled
        assert "takes effect at the next restart" not in caplog.text
        tracing.configure(TracingSection(sample_ratio=1.0, endpoint="http://collector:4318"))
        assert "tracing.endpoint changed: takes effect at the next restart" in caplog.text
        assert tracing.enabled  # the exporter is the one built at start-up
    finally:
        tracing.shutdown()
