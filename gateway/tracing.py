"""OpenTelemetry traces: the SERVER span per request (litestar plugin), a CLIENT span per upstream
attempt with GenAI semantic-convention attributes and specroute's own (speedup among them).

Export goes through a BatchSpanProcessor (a background thread): the request path only creates
spans in memory. An unreachable collector costs a logged warning, nothing else. With tracing off
there is no plugin and no span at all: every hook below is a no-op.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gateway.config import TracingSection

if TYPE_CHECKING:
    from gateway.records import RequestRecord

log = logging.getLogger("specroute.tracing")

OPERATION = {"chat": "chat", "completion": "text_completion"}


def _exporter(section: TracingSection) -> SpanExporter | None:
    kind = os.environ.get("OTEL_TRACES_EXPORTER") or section.exporter
    if kind == "none" and (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or section.endpoint):
        kind = "otlp"
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        return None
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL") or section.protocol
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            log.warning("OTLP over gRPC needs `pip install specroute[grpc]`; using HTTP/protobuf")
        else:
            return GrpcExporter(endpoint=None if env_endpoint else section.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The exporter reads the env endpoint itself (appending /v1/traces); a config endpoint is a base URL.
    endpoint = None if env_endpoint else (section.endpoint.rstrip("/") + "/v1/traces" if section.endpoint else None)
    return OTLPSpanExporter(endpoint=endpoint, timeout=5)


class Tracing:
    """Owns the tracer provider; `tracer` is None when tracing is off."""

    def __init__(self, section: TracingSection, exporter: SpanExporter | None = None) -> None:
        exporter = exporter or _exporter(section)
        self.provider: TracerProvider | None = None
        self.tracer: trace.Tracer | None = None
        if exporter is None:
            return
        service = os.environ.get("OTEL_SERVICE_NAME") or section.service_name
        sampler = None
        if section.sample_ratio is not None and not os.environ.get("OTEL_TRACES_SAMPLER"):
            sampler = ParentBased(TraceIdRatioBased(section.sample_ratio))
        self.provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": service}),
                                       shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("specroute")

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def _otel_config(self) -> Any:
        from litestar.plugins.opentelemetry import OpenTelemetryConfig

        # exclude_spans: without it every streamed chunk becomes a span.
        return OpenTelemetryConfig(
            tracer_provider=self.provider, exclude_spans=["send", "receive"],
            exclude=["/health", "/ready", "/metrics"],
        )

    def litestar_plugin(self) -> Any:
        from litestar.plugins.opentelemetry import OpenTelemetryPlugin

        return OpenTelemetryPlugin(self._otel_config())

    def server_span_middleware(self, app: Any) -> Any:
        """The SERVER span for the fast generation routes, made directly with the tracer.

        The generic OpenTelemetry ASGI middleware (what litestar's plugin uses) costs about as much
        per request as the rest of the gateway: request attributes from the scope, no-op metric
        instruments, a wrapped send per chunk. This keeps what a trace needs (W3C context from the
        incoming headers, the span as current context for the CLIENT spans, method, route and
        status) and nothing else. Other routes keep the plugin's span."""
        tracer = self.tracer
        assert tracer is not None
        extract = propagate.extract
        attach, detach = otel_context.attach, otel_context.detach

        async def traced(scope: dict, receive: Any, send: Any) -> None:
            carrier = {}
            for name, value in scope["headers"]:
                if name == b"traceparent" or name == b"tracestate":
                    carrier[name.decode()] = value.decode("latin-1")
            path = scope["path"]
            span = tracer.start_span(f"POST {path}", context=extract(carrier) if carrier else None,
                                     kind=SpanKind.SERVER,
                                     attributes={"http.request.method": "POST", "http.route": path, "url.path": path})
            status = 0

            async def send_status(message: dict) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            token = attach(trace.set_span_in_context(span))
            try:
                await app(scope, receive, send_status)
            finally:
                if span.is_recording():
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                span.end()
                detach(token)

        return traced

    def start_client_span(self, kind: str, model: str, host: str, port: int | None, body: dict,
                          attempt: int) -> Span | None:
        if self.tracer is None:
            return None
        op = OPERATION[kind]
        span = self.tracer.start_span(f"{op} {model}", kind=SpanKind.CLIENT)
        if not span.is_recording():  # sampled out: no attributes to build
            return span
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
        span.set_attributes(attrs)
        return span

    @staticmethod
    def inject(span: Span | None, headers: dict[str, str]) -> None:
        """W3C traceparent upstream, so an SGLang server run with --enable-trace nests under our span."""
        if span is not None:
            propagate.inject(headers, context=trace.set_span_in_context(span))

    @staticmethod
    def end_client_span(span: Span | None, record: "RequestRecord") -> None:
        if span is None:
            return
        if not span.is_recording():
            span.end()
            return
        attrs: dict[str, Any] = {
            "specroute.backend": record.backend, "specroute.strategy": record.strategy,
            "specroute.policy": record.policy, "specroute.decision.reason": record.reason,
            "specroute.domain": record.domain, "specroute.inflight_at_dispatch": record.inflight,
            "gen_ai.usage.input_tokens": record.prompt_tokens, "gen_ai.usage.output_tokens": record.completion_tokens,
        }
        optional = {
            "specroute.decision.score": record.score, "gen_ai.response.id": record.response_id,
            "gen_ai.response.model": record.response_model, "gen_ai.response.time_to_first_chunk": record.ttft_s,
            "specroute.accept_length": record.accept_length, "specroute.verify_count": record.verify_ct,
            "specroute.decode_tok_s": record.decode_tok_s, "specroute.baseline_tok_s": record.baseline_tok_s,
            "specroute.speedup": record.speedup, "specroute.queue_s": record.queue_s,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        if record.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [record.finish_reason]
        if record.error:
            attrs["error.type"] = record.error_type or "error"
            span.set_status(Status(StatusCode.ERROR, record.error))
        span.set_attributes(attrs)
        span.end()

    def trace_id(self) -> str | None:
        """Hex trace id of the current (SERVER) span, for the log line and the response header."""
        if self.tracer is None:
            return None
        ctx = trace.get_current_span().get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid else None

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
