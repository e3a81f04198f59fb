"""What the request path ships per traced request (`TraceRecord`), the spans the export side
makes of it (`SpanRecord`), their attributes, and the SDK's `ReadableSpan`s.

The request path never builds OpenTelemetry SDK span objects, nor attribute dicts: it encodes one
flat record of raw facts per request (ids, times, status, the upstream address, the request's
record as the access log's JSON) with msgspec. The export side, in its own process, expands each
record into its SERVER and CLIENT spans, names the attributes (`attributes_of`) and hands the
SDK's `ReadableSpan`s (`to_readable`) to a standard SDK exporter (OTLP over HTTP or gRPC, the
console, a test's in-memory one), which encodes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gateway.records import RequestRecord

SCOPE = InstrumentationScope("specroute")
# gen_ai.operation.name per request kind (a Responses request is a chat turn)
OPERATION = {"chat": "chat", "completion": "text_completion", "responses": "chat"}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)  # only sampled spans are recorded
_KINDS = {k.value: k for k in SpanKind}
_UNSET = Status(StatusCode.UNSET)
_SERVER, _CLIENT = SpanKind.SERVER.value, SpanKind.CLIENT.value


class ClientRecord(msgspec.Struct, array_like=True, gc=False):
    """A CLIENT span within a `TraceRecord`: one upstream attempt."""

    span_id: str
    start_ns: int
    end_ns: int
    error: str | None  # None: status unset; else ERROR with this description
    server: tuple[str, int | None]  # the upstream's address and port
    request: bytes  # the request's RequestRecord as JSON (`encode_request`)


class TraceRecord(msgspec.Struct, array_like=True, gc=False):
    """What the request path ships per request (`Tracing.end_server_span`): the SERVER span and the
    CLIENT spans under it, one msgpack array. The gateway encodes plain tuples in this layout (no
    struct to build); the export side decodes this type and expands it (`expand`). `end_ns` 0: the
    record holds only CLIENT spans that ended after their SERVER span had been shipped."""

    trace_id: str  # 32 hex digits
    span_id: str  # the SERVER span's, 16 hex digits
    parent_id: str | None  # from an incoming traceparent: a remote parent
    trace_state: str | None  # the incoming tracestate header, passed on unchanged
    start_ns: int
    end_ns: int
    http: tuple[str, str, int] | None  # method, path, status
    clients: list[ClientRecord] | None

    def spans(self) -> int:
        return (1 if self.holds_server_span() else 0) + len(self.clients or ())

    def holds_server_span(self) -> bool:
        return bool(self.end_ns) and self.http is not None


class SpanRecord(msgspec.Struct, gc=False):
    """One finished, sampled span, as the export side handles it: the raw facts its attributes are
    named from, `http` for a SERVER span, `server` and `request` for a CLIENT span."""

    name: str
    kind: int  # opentelemetry.trace.SpanKind value
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str | None  # 16 hex digits; None for a root span
    parent_remote: bool  # the parent came in a traceparent header
    trace_state: str | None
    start_ns: int
    end_ns: int
    error: str | None = None  # None: status unset; else ERROR with this description ("" for none)
    http: tuple[str, str, str, int] | None = None  # method, route, path, status
    server: tuple[str, int | None] | None = None  # the upstream's address and port
    request: RequestRecord | None = None


_request_decoder = msgspec.json.Decoder(RequestRecord)


# Routes with a path parameter (gateway/app.py): prefix -> the parameter's name
_TEMPLATED = (("/admin/backends/", "{name}"), ("/v1/responses/", "{response_id}"))


def route_template(path: str) -> str:
    """Span names use the route, not the path, so that admin calls do not make a name per backend
    nor stored Responses one per response (span names must be few)."""
    for prefix, parameter in _TEMPLATED:
        if path.startswith(prefix) and len(path) > len(prefix):
            rest = path[len(prefix) :].split("/", 1)
            return prefix + parameter + ("/" + rest[1] if len(rest) > 1 else "")
    return path


def expand(records: Iterable[TraceRecord]) -> list[SpanRecord]:
    """The spans the records stand for: each SERVER span, then the CLIENT spans under it."""
    out: list[SpanRecord] = []
    for t in records:
        if t.http is not None and t.holds_server_span():
            method, path, status = t.http
            route = route_template(path)
            out.append(
                SpanRecord(
                    f"{method} {route}",
                    _SERVER,
                    t.trace_id,
                    t.span_id,
                    t.parent_id,
                    t.parent_id is not None,
                    t.trace_state,
                    t.start_ns,
                    t.end_ns,
                    "" if status >= 500 else None,
                    (method, route, path, status),
                )
            )
        for c in t.clients or ():
            request = _request_decoder.decode(c.request)
            out.append(
                SpanRecord(
                    f"{OPERATION.get(request.kind, request.kind)} {request.model}",
                    _CLIENT,
                    t.trace_id,
                    c.span_id,
                    t.span_id,
                    False,
                    t.trace_state,
                    c.start_ns,
                    c.end_ns,
                    c.error,
                    None,
                    c.server,
                    request,
                )
            )
    return out


def _request_attributes(attrs: dict[str, Any], r: RequestRecord) -> None:
    attrs["gen_ai.operation.name"] = OPERATION.get(r.kind, r.kind)
    attrs["gen_ai.provider.name"] = "sglang"
    attrs["gen_ai.request.model"] = r.model
    attrs["gen_ai.request.stream"] = r.stream
    attrs["specroute.attempt"] = r.attempt
    attrs["specroute.backend"] = r.backend
    attrs["specroute.strategy"] = r.strategy
    attrs["specroute.policy"] = r.policy
    attrs["specroute.decision.reason"] = r.reason
    attrs["specroute.domain"] = r.domain
    attrs["specroute.inflight_at_dispatch"] = r.inflight
    for key, value in (
        ("gen_ai.usage.input_tokens", r.prompt_tokens),  # not reported: not known, so not 0
        ("gen_ai.usage.output_tokens", r.completion_tokens),
        ("specroute.decision.score", r.score),
        ("gen_ai.response.id", r.response_id),
        ("gen_ai.response.model", r.response_model),
        ("gen_ai.response.time_to_first_chunk", r.ttft_s),
        ("specroute.ttft_answer_s", r.ttft_answer_s),
        ("specroute.reasoning_tokens", r.reasoning_tokens),
        ("specroute.cached_tokens", r.cached_tokens),
        ("specroute.accept_length", r.accept_length),
        ("specroute.verify_count", r.verify_ct),
        ("specroute.decode_tok_s", r.decode_tok_s),
        ("specroute.baseline_tok_s", r.baseline_tok_s),
        ("specroute.speedup", r.speedup),
        ("specroute.queue_s", r.queue_s),
        ("specroute.priority", r.priority),
        ("gen_ai.request.max_tokens", r.max_tokens),
        ("gen_ai.request.temperature", r.temperature),
    ):
        if value is not None:
            attrs[key] = value
    if r.sequences != 1:  # GenAI semantic conventions: set when not 1
        attrs["gen_ai.request.choice.count"] = r.sequences
    if r.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = (r.finish_reason,)
    if r.error:
        attrs["error.type"] = r.error_type or "error"


def attributes_of(r: SpanRecord) -> dict[str, Any]:
    """The span's attributes with their semantic-convention names (HTTP, GenAI) and specroute's."""
    attrs: dict[str, Any] = {}
    if r.http is not None:
        method, route, path, status = r.http
        attrs.update(
            {"http.request.method": method, "http.route": route, "url.path": path, "http.response.status_code": status}
        )
    if r.request is not None:
        _request_attributes(attrs, r.request)
    if r.server is not None:
        host, port = r.server
        attrs["server.address"] = host
        if port is not None:
            attrs["server.port"] = port
    return attrs


def to_readable(records: Iterable[SpanRecord], resource: Resource) -> list[ReadableSpan]:
    out: list[ReadableSpan] = []
    for r in records:
        trace_id = int(r.trace_id, 16)
        state = TraceState.from_header([r.trace_state]) if r.trace_state else None
        context = SpanContext(trace_id, int(r.span_id, 16), False, _SAMPLED, state)
        parent = SpanContext(trace_id, int(r.parent_id, 16), r.parent_remote, _SAMPLED, state) if r.parent_id else None
        status = _UNSET if r.error is None else Status(StatusCode.ERROR, r.error or None)
        out.append(
            ReadableSpan(
                name=r.name,
                context=context,
                parent=parent,
                resource=resource,
                attributes=attributes_of(r),
                kind=_KINDS.get(r.kind, SpanKind.INTERNAL),
                status=status,
                start_time=r.start_ns,
                end_time=r.end_ns,
                instrumentation_scope=SCOPE,
            )
        )
    return out
