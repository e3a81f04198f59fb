"""OpenTelemetry traces: a SERVER span per request, a CLIENT span per upstream attempt with GenAI
semantic-convention attributes and specroute's own (speedup among them).

The request path records spans as plain structs (`gateway.spans.SpanRecord`) and W3C trace context
by hand: parse `traceparent`, sample once per trace with the SDK's samplers and rules
(`gateway.sampling`), inject `traceparent` upstream. The OpenTelemetry SDK runs only on the export
side, in a separate process (`gateway.span_export`), so tracing costs the gateway a few
microseconds per request instead of the SDK's ~150 (span objects, locks, OTLP encoding). What a
collector receives is the SDK's own OTLP encoding, configured by the standard OTEL_* variables.

With tracing off there is no middleware and no span at all: every hook below is a no-op.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar
from random import getrandbits as _getrandbits
from time import time_ns as _time_ns
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind

from gateway.config import TracingSection
from gateway.records import RequestRecord, encode_request
from gateway.sampling import Sampler, sampler_from
from gateway.span_export import ProcessSink, SpanShipper, ThreadSink, exporter_kind, resource_for
from gateway.spans import SpanRecord

log = logging.getLogger("specroute.tracing")
OPERATION = {"chat": "chat", "completion": "text_completion"}
_SERVER, _CLIENT = SpanKind.SERVER.value, SpanKind.CLIENT.value
# W3C Trace Context, as the SDK's propagator reads it: version 00 has exactly four fields; a later
# version may append more. All-zero ids are invalid.
_TRACEPARENT = re.compile(r"^\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
# Not traced: probes and scrapes would outnumber requests.
UNTRACED_PATHS = frozenset({"/health", "/ready", "/metrics"})
_FIXED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models"})


class ServerSpan:
    """The request's SERVER span while it runs: what CLIENT spans and the log line need."""

    __slots__ = ("trace_id", "span_id", "parent_id", "parent_remote", "trace_state", "sampled", "start_ns")

    def __init__(self, trace_id: str, parent_id: str | None, trace_state: str | None, sampled: bool) -> None:
        self.trace_id = trace_id
        self.span_id = "%016x" % _getrandbits(64)
        self.parent_id = parent_id
        self.parent_remote = parent_id is not None
        self.trace_state = trace_state
        self.sampled = sampled
        self.start_ns = _time_ns() if sampled else 0


class ClientSpan:
    """One upstream attempt of a sampled trace (sampled-out traces make none)."""

    __slots__ = ("server", "span_id", "name", "start_ns", "upstream")

    def __init__(self, server: ServerSpan, name: str, upstream: tuple) -> None:
        self.server = server
        self.span_id = "%016x" % _getrandbits(64)
        self.name = name
        self.start_ns = _time_ns()
        self.upstream = upstream


_current: ContextVar[ServerSpan | None] = ContextVar("specroute_server_span", default=None)


def _route_template(path: str) -> str:
    """Span names use the route, not the path, so admin calls do not make a name per backend."""
    if path.startswith("/admin/backends/"):
        rest = path[len("/admin/backends/"):].split("/", 1)
        return "/admin/backends/{name}" + ("/" + rest[1] if len(rest) > 1 else "")
    return path


class Tracing:
    """Owns sampling, the span shipper and the exporter behind it; `enabled` is False when off."""

    def __init__(self, section: TracingSection, exporter: SpanExporter | None = None) -> None:
        self.section = section
        self.shipper: SpanShipper | None = None
        self.sampler: Sampler = sampler_from(section.sample_ratio)
        if exporter is not None:
            self.shipper = SpanShipper(ThreadSink(exporter, resource_for(section)))
        elif exporter_kind(section) != "none":
            self.shipper = SpanShipper(ProcessSink(section))

    def configure(self, section: TracingSection) -> None:
        """A reloaded config: the sampling ratio applies to new requests at once (raise it during an
        incident, lower it after); the exporter settings need a restart, as they did at start-up."""
        self.sampler = sampler_from(section.sample_ratio)
        changed = [f"tracing.{name}" for name in ("exporter", "endpoint", "protocol", "service_name")
                   if getattr(section, name) != getattr(self.section, name)]
        if changed:
            log.warning("%s changed: takes effect at the next restart", ", ".join(changed))
        self.section = section

    @property
    def enabled(self) -> bool:
        return self.shipper is not None

    @property
    def dropped(self) -> int:
        return self.shipper.dropped if self.shipper is not None else 0

    def start_server_span(self, traceparent: str | None, tracestate: str | None) -> ServerSpan:
        if traceparent is not None and (m := _TRACEPARENT.match(traceparent)):
            version, tid, sid, flags, rest = m.groups()
            if version != "ff" and not (version == "00" and rest) and tid != _ZERO_TRACE and sid != _ZERO_SPAN:
                sampled = self.sampler.sampled(int(tid[16:], 16), bool(int(flags, 16) & 1))
                return ServerSpan(tid, sid, tracestate, sampled)
        tid_int = _getrandbits(128)
        return ServerSpan("%032x" % tid_int, None, None, self.sampler.sampled(tid_int, None))

    @staticmethod
    def activate(span: ServerSpan) -> Any:
        """Make `span` the current request's SERVER span (for CLIENT spans and the trace id)."""
        return _current.set(span)

    @staticmethod
    def deactivate(token: Any) -> None:
        _current.reset(token)

    def end_server_span(self, span: ServerSpan, method: str, path: str, status: int) -> None:
        if span.sampled and self.shipper is not None:
            route = path if path in _FIXED_ROUTES else _route_template(path)
            self.shipper.add(SpanRecord(
                f"{method} {route}", _SERVER, span.trace_id, span.span_id, span.parent_id, span.parent_remote,
                span.trace_state, span.start_ns, _time_ns(), "" if status >= 500 else None,
                (method, route, path, status)))

    def server_span_middleware(self, app: Any) -> Any:
        """ASGI: the SERVER span of every traced request, current while the app runs (the two
        generation routes make theirs in `FastRoutes`, from the headers they decode anyway).

        Made here rather than by the generic OpenTelemetry ASGI middleware (what litestar's plugin
        uses), which cost about as much per request as the rest of the gateway: it keeps what a
        trace needs (W3C context from the incoming headers, method, route, path, status)."""
        assert self.shipper is not None
        start, end = self.start_server_span, self.end_server_span

        async def traced(scope: dict, receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] != "http" or path in UNTRACED_PATHS:
                return await app(scope, receive, send)
            traceparent = tracestate = None
            for name, value in scope["headers"]:
                if name == b"traceparent":
                    traceparent = value.decode("latin-1")
                elif name == b"tracestate":
                    tracestate = value.decode("latin-1")
            span = start(traceparent, tracestate)
            token = _current.set(span)
            if not span.sampled:  # the context still travels (trace id header, upstream traceparent)
                try:
                    return await app(scope, receive, send)
                finally:
                    _current.reset(token)
            status = 0

            async def send_status(message: dict) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                _current.reset(token)
                end(span, scope["method"], path, status)

        return traced

    def start_client_span(self, kind: str, model: str, host: str, port: int | None, body: dict,
                          attempt: int) -> ClientSpan | None:
        """A CLIENT span for a sampled trace; None when tracing is off or the trace is sampled out."""
        if self.shipper is None:
            return None
        server = _current.get()
        if server is None:  # called outside a traced request (tests driving the proxy directly)
            server = self.start_server_span(None, None)
        if not server.sampled:
            return None
        op = OPERATION[kind]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        temperature = body.get("temperature")
        upstream = (op, model, bool(body.get("stream")), host, port, attempt,
                    max_tokens if isinstance(max_tokens, int) else None,
                    float(temperature) if isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                    else None)
        return ClientSpan(server, f"{op} {model}", upstream)

    def inject(self, span: ClientSpan | None, headers: dict[str, str]) -> None:
        """W3C traceparent upstream, so an SGLang server run with --enable-trace nests under our span.
        A sampled-out trace passes its context on too, flagged not sampled, with the SERVER span as
        parent (no CLIENT span was made for it)."""
        if span is not None:
            server = span.server
            headers["traceparent"] = f"00-{server.trace_id}-{span.span_id}-01"
        elif self.shipper is not None and (server := _current.get()) is not None:
            headers["traceparent"] = f"00-{server.trace_id}-{server.span_id}-00"
        else:
            return
        if server.trace_state:
            headers["tracestate"] = server.trace_state

    def end_client_span(self, span: ClientSpan | None, record: RequestRecord, encoded: bytes | None = None) -> None:
        """`encoded`: the record's JSON when the access log made it already (`encode_request`)."""
        if span is None or self.shipper is None:
            return
        server = span.server
        self.shipper.add(SpanRecord(
            span.name, _CLIENT, server.trace_id, span.span_id, server.span_id, False, server.trace_state,
            span.start_ns, _time_ns(), record.error if record.error else None, None, span.upstream,
            encode_request(record) if encoded is None else encoded))

    def trace_id(self) -> str | None:
        """Hex trace id of the current request, for the log line and the response header."""
        if self.shipper is None:
            return None
        span = _current.get()
        return span.trace_id if span is not None else None

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        return self.shipper.force_flush(timeout_s) if self.shipper is not None else True

    def shutdown(self) -> None:
        if self.shipper is not None:
            self.shipper.shutdown()
            self.shipper = None
