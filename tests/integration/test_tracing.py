"""Trace context and sampling as the gateway does them by hand, checked against the OpenTelemetry SDK,
and the span export pipeline's bounds (the exporter process falling behind, shutdown)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time

import openai
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from gateway.access_log import AccessLog
from gateway.config import TracingSection, config_from_dict
from gateway.records import RequestRecord, encode_request
from gateway.sampling import sampler_from
from gateway.span_export import ProcessSink, SpanShipper
from gateway.tracing import Tracing
from tests.inprocess import serve_in_thread
from tests.support import free_port, wait_until

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


class _Upstream:
    """A minimal SGLang-shaped upstream that records the trace headers it receives."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen: list[tuple[str | None, str | None]] = []
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        app = web.Application()

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        app.router.add_get("/ready", ok)
        app.router.add_get("/health", ok)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _chat(self, request: web.Request) -> web.Response:
        self.seen.append((request.headers.get("traceparent"), request.headers.get("tracestate")))
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def upstream():
    u = _Upstream()
    yield u
    u.close()


def test_upstream_gets_the_client_spans_traceparent_and_the_tracestate(upstream):
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    config = config_from_dict(
        {"backends": [{"name": "up", "url": f"http://127.0.0.1:{upstream.port}", "model": "m", "strategy": "ar"}]}
    )
    with serve_in_thread(config, tracing=tracing, access_log=AccessLog(False)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        sampled = client.chat.completions.with_raw_response.create(
            model="m",
            messages=msgs,
            max_tokens=1,
            extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "v=1"},
        )
        unsampled = client.chat.completions.with_raw_response.create(
            model="m", messages=msgs, max_tokens=1, extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-00"}
        )
        tracing.force_flush()
    # the trace-id header names a trace the collector has: only a recorded (sampled) one
    assert sampled.headers["x-specroute-trace-id"] == TRACE
    assert "x-specroute-trace-id" not in unsampled.headers
    spans = exporter.get_finished_spans()
    client_span = next(s for s in spans if s.kind is SpanKind.CLIENT)
    assert len([s for s in spans if s.kind is SpanKind.CLIENT]) == 1  # the unsampled request left no span
    assert upstream.seen[0] == (f"00-{TRACE}-{client_span.context.span_id:016x}-01", "v=1")
    assert client_span.context.trace_state.to_header() == "v=1"
    traceparent, _ = upstream.seen[1]  # sampled out: the context still travels, flagged not sampled
    assert traceparent.startswith(f"00-{TRACE}-") and traceparent.endswith("-00")


def _record(i: int, with_server_span: bool = False) -> tuple:
    """A `TraceRecord` as the request path ships it: a SERVER span and its CLIENT span, or (by
    default) one CLIENT span whose SERVER span was shipped before."""
    request = RequestRecord(
        request_id="r",
        model="m",
        kind="chat",
        stream=True,
        status=200,
        duration_s=0.1,
        speedup=1.5,
        finish_reason="stop",
        max_tokens=8,
    )
    client = ("%016x" % (i + 1), 1, 2, None, ("127.0.0.1", 30000), encode_request(request))
    if with_server_span:
        return ("%032x" % (i + 1), "%016x" % (i + 2), None, None, 1, 3, ("POST", "/v1/chat/completions", 200), [client])
    return ("%032x" % (i + 1), "%016x" % (i + 2), None, None, 0, 0, None, [client])


def test_a_stalled_exporter_process_costs_bounded_memory_and_counted_drops():
    sink = ProcessSink(TracingSection(exporter="console"), max_pending_bytes=256 << 10)
    shipper = SpanShipper(sink)
    os.kill(sink.pid, signal.SIGSTOP)  # the exporter stops reading: the pipe fills, then the buffer
    try:
        for i in range(50_000):
            shipper.add(_record(i, with_server_span=True))
        shipper.flush()
        assert sink.dropped > 0 and sink.dropped % 2 == 0  # spans counted: two per record
        assert sink._pending_bytes <= 256 << 10
    finally:
        os.kill(sink.pid, signal.SIGCONT)
        sink._proc.kill()
        sink._proc.wait(5)


def test_exporter_process_exports_what_is_left_at_shutdown(capfd):
    shipper = SpanShipper(ProcessSink(TracingSection(exporter="console")))
    for i in range(3):
        shipper.add(_record(i))  # fewer than a batch, no event loop: sent at once
    shipper.shutdown()
    out = capfd.readouterr().out
    assert out.count('"name": "chat m"') == 3 and '"specroute.speedup": 1.5' in out
    assert '"gen_ai.request.max_tokens": 8' in out and '"gen_ai.response.finish_reasons": [' in out


def test_exporter_process_outlives_a_group_sigterm_and_ends_at_eof():
    """The gateway's process group gets SIGTERM on shutdown: the exporter keeps going until the
    gateway closes the pipe (or dies, which closes it too), so the last spans are not lost."""
    sink = ProcessSink(TracingSection(exporter="console"))

    def ignores_sigterm() -> bool:  # its start-up done: SIGTERM in the kernel's ignored mask
        with open(f"/proc/{sink.pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
        return bool(mask & (1 << (signal.SIGTERM - 1)))

    assert wait_until(ignores_sigterm, timeout=30)
    os.kill(sink.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert sink._proc.poll() is None
    os.close(sink._fd)  # what the gateway's death does to the pipe
    assert sink._proc.wait(60) == 0


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
