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

import re
import time
from contextvars import ContextVar
from random import getrandbits
from typing import TYPE_CHECKING, Any, Callable

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind

from gateway.config import TracingSection
from gateway.sampling import Sampler, sampler_from
from gateway.span_export import ProcessSink, SpanShipper, ThreadSink, exporter_kind, resource_for
from gateway.spans import SpanRecord

if TYPE_CHECKING:
    from gateway.records import RequestRecord

OPERATION = {"chat": "chat", "completion": "text_completion"}
_SERVER, _CLIENT = SpanKind.SERVER.value, SpanKind.CLIENT.value
# W3C Trace Context, as the SDK's propagator reads it: version 00 has exactly four fields; a later
# version may append more. All-zero ids are invalid.
_TRACEPARENT = re.compile(r"^\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
# Not traced: probes and scrapes would outnumber requests.
UNTRACED_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ServerSpan:
    """The request's SERVER span while it runs: what CLIENT spans and the log line need."""

    __slots__ = ("trace_id", "span_id", "parent_id", "parent_remote", "trace_state", "sampled", "start_ns")

    def __init__(self, trace_id: str, parent_id: str | None, trace_state: str | None, sampled: bool) -> None:
        self.trace_id = trace_id
        self.span_id = "%016x" % getrandbits(64)
        self.parent_id = parent_id
        self.parent_remote = parent_id is not None
        self.trace_state = trace_state
        self.sampled = sampled
        self.start_ns = time.time_ns()


class ClientSpan:
    """One upstream attempt. `attributes` is None when the trace is sampled out (nothing recorded)."""

    __slots__ = ("server", "span_id", "name", "start_ns", "attributes")

    def __init__(self, server: ServerSpan, name: str, attributes: dict[str, Any] | None) -> None:
        self.server = server
        self.span_id = "%016x" % getrandbits(64)
        self.name = name
        self.start_ns = time.time_ns()
        self.attributes = attributes

    @property
    def traceparent(self) -> str:
        return f"00-{self.server.trace_id}-{self.span_id}-{'01' if self.server.sampled else '00'}"


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
        self.shipper: SpanShipper | None = None
        self.sampler: Sampler = sampler_from(section.sample_ratio)
        if exporter is not None:
            self.shipper = SpanShipper(ThreadSink(exporter, resource_for(section)))
        elif exporter_kind(section) != "none":
            self.shipper = SpanShipper(ProcessSink(section))

    @property
    def enabled(self) -> bool:
        return self.shipper is not None

    @property
    def dropped(self) -> int:
        return self.shipper.dropped if self.shipper is not None else 0

    @property
    def exporter_pid(self) -> int | None:
        sink = self.shipper.sink if self.shipper is not None else None
        return sink.pid if isinstance(sink, ProcessSink) else None

    def start_server_span(self, traceparent: str | None, tracestate: str | None) -> ServerSpan:
        parent_id = parent_sampled = None
        trace_id = None
        if traceparent is not None and (m := _TRACEPARENT.match(traceparent)):
            version, tid, sid, flags, rest = m.groups()
            if version != "ff" and not (version == "00" and rest) and tid != _ZERO_TRACE and sid != _ZERO_SPAN:
                trace_id, parent_id, parent_sampled = tid, sid, bool(int(flags, 16) & 1)
        if trace_id is None:
            trace_id = "%032x" % getrandbits(128)
            tracestate = None
        sampled = self.sampler.sampled(int(trace_id[16:], 16), parent_sampled)
        return ServerSpan(trace_id, parent_id, tracestate, sampled)

    def server_span_middleware(self, app: Any) -> Any:
        """ASGI: the SERVER span of every traced request, current while the app runs.

        Made here rather than by the generic OpenTelemetry ASGI middleware (what litestar's plugin
        uses), which cost about as much per request as the rest of the gateway: it keeps what a
        trace needs (W3C context from the incoming headers, method, route, path, status)."""
        shipper = self.shipper
        assert shipper is not None
        start = self.start_server_span

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
            status = 0

            async def send_status(message: dict) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            token = _current.set(span)
            try:
                await app(scope, receive, send_status if span.sampled else send)
            finally:
                _current.reset(token)
                if span.sampled:
                    method = scope["method"]
                    route = _route_template(path)
                    shipper.add(SpanRecord(
                        f"{method} {route}", _SERVER, span.trace_id, span.span_id, span.parent_id,
                        span.parent_remote, span.trace_state, span.start_ns, time.time_ns(),
                        {"http.request.method": method, "http.route": route, "url.path": path,
                         "http.response.status_code": status},
                        "" if status >= 500 else None))

        return traced

    def start_client_span(self, kind: str, model: str, host: str, port: int | None, body: dict,
                          attempt: int) -> ClientSpan | None:
        if self.shipper is None:
            return None
        server = _current.get()
        if server is None:  # called outside a traced request (tests driving the proxy directly)
            server = self.start_server_span(None, None)
        op = OPERATION[kind]
        if not server.sampled:  # sampled out: trace context only, no attributes to build
            return ClientSpan(server, f"{op} {model}", None)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op, "gen_ai.provider.name": "sglang", "gen_ai.request.model": model,
            "gen_ai.request.stream": bool(body.get("stream")), "server.address": host,
            "specroute.attempt": attempt,
        }
        if port is not None:
            attrs["server.port"] = port
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(max_tokens, int):
            attrs["gen_ai.request.max_tokens"] = max_tokens
        temperature = body.get("temperature")
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
            attrs["gen_ai.request.temperature"] = float(temperature)
        return ClientSpan(server, f"{op} {model}", attrs)

    @staticmethod
    def inject(span: ClientSpan | None, headers: dict[str, str]) -> None:
        """W3C traceparent upstream, so an SGLang server run with --enable-trace nests under our span."""
        if span is not None:
            headers["traceparent"] = span.traceparent
            if span.server.trace_state:
                headers["tracestate"] = span.server.trace_state

    def end_client_span(self, span: ClientSpan | None, record: "RequestRecord") -> None:
        if span is None or span.attributes is None or self.shipper is None:
            return
        attrs = span.attributes
        attrs["specroute.backend"] = record.backend
        attrs["specroute.strategy"] = record.strategy
        attrs["specroute.policy"] = record.policy
        attrs["specroute.decision.reason"] = record.reason
        attrs["specroute.domain"] = record.domain
        attrs["specroute.inflight_at_dispatch"] = record.inflight
        attrs["gen_ai.usage.input_tokens"] = record.prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = record.completion_tokens
        for key, value in (
            ("specroute.decision.score", record.score), ("gen_ai.response.id", record.response_id),
            ("gen_ai.response.model", record.response_model),
            ("gen_ai.response.time_to_first_chunk", record.ttft_s),
            ("specroute.accept_length", record.accept_length), ("specroute.verify_count", record.verify_ct),
            ("specroute.decode_tok_s", record.decode_tok_s), ("specroute.baseline_tok_s", record.baseline_tok_s),
            ("specroute.speedup", record.speedup), ("specroute.queue_s", record.queue_s),
        ):
            if value is not None:
                attrs[key] = value
        if record.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [record.finish_reason]
        error = None
        if record.error:
            attrs["error.type"] = record.error_type or "error"
            error = record.error
        server = span.server
        self.shipper.add(SpanRecord(
            span.name, _CLIENT, server.trace_id, span.span_id, server.span_id, False, server.trace_state,
            span.start_ns, time.time_ns(), attrs, error))

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
