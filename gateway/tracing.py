"""OpenTelemetry traces: a SERVER span per request, a CLIENT span per upstream attempt with GenAI
semantic-convention attributes and specroute's own (speedup among them).

The request path keeps W3C trace context by hand (parse `traceparent`, sample once per trace with
the SDK's samplers and rules (`gateway.sampling`), inject `traceparent` upstream) and records each
traced request as one flat record of raw facts: ids, times, status, the upstream address and the
request's record, the very JSON the access log line is made of. The OpenTelemetry SDK runs only on
the export side, in a separate process (`gateway.span_export`), which makes the spans from those
records, names their attributes and encodes them, so the gateway pays for a flat record per
request, not for the SDK's span objects, locks and OTLP encoding (docs/performance.md). What a collector
receives is the SDK's OTLP message, configured by the standard OTEL_* variables.

With tracing off there is no middleware and no span at all: every hook below is a no-op.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar
from random import getrandbits as _getrandbits
from time import time_ns as _time_ns
from typing import Any

import msgspec
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry.sdk.trace.export import SpanExporter

from gateway.config import TracingSection
from gateway.records import RequestRecord, encode_request
from gateway.sampling import Sampler, sampler_from
from gateway.span_export import ProcessSink, SpanShipper, ThreadSink, exporter_kind, resource_for

log = logging.getLogger("specroute.tracing")
# W3C Trace Context, as the SDK's propagator reads it: version 00 has exactly four fields; a later
# version may append more. All-zero ids are invalid.
_TRACEPARENT = re.compile(r"^\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _span_id() -> str:
    # to_bytes().hex(), not "%016x": the cheaper of the two (docs/performance.md)
    return (_getrandbits(64) or 1).to_bytes(8, "big").hex()


class Trace(msgspec.Struct, gc=False):
    """A request's trace context while it runs: its SERVER span, and the CLIENT spans that ended
    before it (shipped with it, as one record: one encoding per request, not one per span).
    A struct: made in C, a quarter of a Python class's `__init__`. `gc=False`: it holds no cycle."""

    trace_id: str
    span_id: str
    parent_id: str | None
    trace_state: str | None
    sampled: bool
    start_ns: int = 0
    clients: list[tuple[Any, ...]] | None = None  # ended CLIENT spans, as `gateway.spans.ClientRecord` tuples
    ended: bool = False  # the SERVER span is shipped: a CLIENT span ending later goes alone


# A CLIENT span while its upstream attempt runs: (trace, span id, start ns, (host, port)). A tuple,
# not an object: it lives for one attempt and only `end_client_span` reads it.
ClientSpan = tuple[Trace, str, int, tuple[str, int | None]]


_current: ContextVar[Trace | None] = ContextVar("specroute_trace", default=None)


class Tracing:
    """Owns sampling, the span shipper and the exporter behind it; `enabled` is False when off."""

    def __init__(self, section: TracingSection, exporter: SpanExporter | None = None) -> None:
        self.section = section
        self.shipper: SpanShipper | None = None
        self.sampler: Sampler = sampler_from(section.sample_ratio)
        self._all_roots = self.sampler.samples_every_root
        if exporter is not None:
            self.shipper = SpanShipper(ThreadSink(exporter, resource_for(section)))
        elif exporter_kind(section) != "none":
            self.shipper = SpanShipper(ProcessSink(section))

    def configure(self, section: TracingSection) -> None:
        """A reloaded config: the sampling ratio applies to new requests at once (raise it during an
        incident, lower it after); the exporter settings need a restart, as they did at start-up."""
        self.sampler = sampler_from(section.sample_ratio)
        self._all_roots = self.sampler.samples_every_root
        changed = [
            f"tracing.{name}"
            for name in ("exporter", "endpoint", "protocol", "service_name")
            if getattr(section, name) != getattr(self.section, name)
        ]
        if changed:
            log.warning("%s changed: takes effect at the next restart", ", ".join(changed))
        self.section = section

    @property
    def enabled(self) -> bool:
        return self.shipper is not None

    @property
    def dropped(self) -> int:
        return self.shipper.dropped if self.shipper is not None else 0

    def start_server_span(self, traceparent: str | None, tracestate: str | None) -> Trace:
        if traceparent is None:  # a new trace, the common case first
            bits = _getrandbits(128) or 1
            trace_id = bits.to_bytes(16, "big").hex()
            # The root SERVER span's id is the trace id's low 64 bits (B3's root-span convention):
            # random, unique in its trace, one draw less.
            span_id = trace_id[16:]
            if span_id == _ZERO_SPAN:  # 1 in 2^64: an all-zero id is invalid
                span_id = _span_id()
            if self._all_roots or self.sampler.sampled(bits, None):
                return Trace(trace_id, span_id, None, None, True, _time_ns())
            return Trace(trace_id, span_id, None, None, False)
        if m := _TRACEPARENT.match(traceparent):
            version, tid, sid, flags, rest = m.groups()
            if version != "ff" and not (version == "00" and rest) and tid != _ZERO_TRACE and sid != _ZERO_SPAN:
                sampled = self.sampler.sampled(int(tid[16:], 16), bool(int(flags, 16) & 1))
                return Trace(tid, _span_id(), sid, tracestate, sampled, _time_ns() if sampled else 0)
        return self.start_server_span(None, None)  # an invalid traceparent starts a new trace

    def current(self) -> Trace | None:
        """The current request's trace (None with tracing off): set by `server_span_middleware` for
        the routes litestar serves; the generation routes pass theirs to the proxy as an argument."""
        return _current.get() if self.shipper is not None else None

    def end_server_span(self, trace: Trace, method: str, path: str, status: int) -> None:
        """Ships the trace's SERVER span with the CLIENT spans that ended before it, as one record:
        a plain tuple in the layout of `gateway.spans.TraceRecord`, which the export side decodes."""
        trace.ended = True
        if trace.sampled and self.shipper is not None:
            self.shipper.add(
                (
                    trace.trace_id,
                    trace.span_id,
                    trace.parent_id,
                    trace.trace_state,
                    trace.start_ns,
                    _time_ns(),
                    (method, path, status),
                    trace.clients,
                )
            )

    def server_span_middleware(self, app: ASGIApp) -> ASGIApp:
        """litestar middleware for the routes it is given (gateway.app: the API and admin routes;
        not the probes and scrapes, which would outnumber requests, nor the generation routes,
        which make theirs in gateway.generation): the SERVER span of each traced request, current
        while the route runs.

        Made here rather than by the generic OpenTelemetry ASGI middleware (what litestar's plugin
        uses), which cost about as much per request as the rest of the gateway: it keeps what a
        trace needs (W3C context from the incoming headers, method, route, path, status)."""
        assert self.shipper is not None
        start, end = self.start_server_span, self.end_server_span

        async def traced(scope: Scope, receive: Receive, send: Send) -> None:
            traceparent = tracestate = None
            for name, value in scope["headers"]:
                if name == b"traceparent":
                    traceparent = value.decode("latin-1")
                elif name == b"tracestate":
                    tracestate = value.decode("latin-1")
            trace = start(traceparent, tracestate)
            token = _current.set(trace)
            if not trace.sampled:  # the context still travels (trace id header, upstream traceparent)
                try:
                    await app(scope, receive, send)
                finally:
                    _current.reset(token)
                return
            status = 0

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                _current.reset(token)
                end(trace, str(scope.get("method", "GET")), scope["path"], status)

        return traced

    def start_client_span(
        self, trace: Trace | None, address: tuple[str, int | None], headers: dict[str, str]
    ) -> ClientSpan | None:
        """An upstream attempt to `address` (host, port): its W3C traceparent in `headers` (so an
        SGLang server run with --enable-trace nests under our span), and for a sampled trace its
        CLIENT span, None otherwise. What the attempt asked for (model, stream, max_tokens,
        temperature, attempt) is in the request's record, which ends the span. A sampled-out trace
        passes its context on too, flagged not sampled, with the SERVER span as parent."""
        if self.shipper is None:
            return None
        if trace is None:  # the proxy driven without a SERVER span (tests): a trace that has none
            trace = self.start_server_span(None, None)
            trace.ended = True
        if trace.trace_state:
            headers["tracestate"] = trace.trace_state
        elif "tracestate" in headers:  # it came with an invalid traceparent: it belongs to no trace
            del headers["tracestate"]
        if not trace.sampled:
            headers["traceparent"] = f"00-{trace.trace_id}-{trace.span_id}-00"
            return None
        span_id = _span_id()
        headers["traceparent"] = f"00-{trace.trace_id}-{span_id}-01"
        return (trace, span_id, _time_ns(), address)

    def end_client_span(self, span: ClientSpan | None, record: RequestRecord, encoded: bytes | None = None) -> None:
        """`encoded`: the record's JSON when the access log made it already (`encode_request`).
        The span waits in its trace for the SERVER span; one ending after that goes alone."""
        if span is None or self.shipper is None:
            return
        trace = span[0]
        client = (
            span[1],
            span[2],
            _time_ns(),
            record.error or None,
            span[3],
            encode_request(record) if encoded is None else encoded,
        )
        if trace.ended:  # end 0: no SERVER span in this record, only its ids (the parent)
            self.shipper.add((trace.trace_id, trace.span_id, trace.parent_id, trace.trace_state, 0, 0, None, [client]))
        elif trace.clients is None:
            trace.clients = [client]
        else:
            trace.clients.append(client)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        return self.shipper.force_flush(timeout_s) if self.shipper is not None else True

    def shutdown(self) -> None:
        if self.shipper is not None:
            self.shipper.shutdown()
            self.shipper = None
