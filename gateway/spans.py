"""A finished span as the request path records it, and its conversion to the SDK's ReadableSpan.

The request path never builds OpenTelemetry SDK span objects: a `SpanRecord` is a plain struct
(ids as hex, times in ns, the facts the attributes are named from) that msgspec encodes in about
a microsecond.
The export side turns records into `ReadableSpan`s and hands them to a standard SDK exporter
(OTLP over HTTP/protobuf or gRPC, console, or a test's in-memory one), so what reaches a collector
is the SDK's own encoding.
"""

from __future__ import annotations

from typing import Any, Iterable

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gateway.records import RequestRecord

SCOPE = InstrumentationScope("specroute")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)  # only sampled spans are recorded
_KINDS = {k.value: k for k in SpanKind}
_UNSET = Status(StatusCode.UNSET)


class SpanRecord(msgspec.Struct, array_like=True, gc=False):
    """One finished, sampled span. `array_like`: encoded as a msgpack array, no field names.

    The request path stores the raw facts, not attribute dicts: `http` for a SERVER span, `upstream`
    and `request` for a CLIENT span. `request` is the request's record as JSON, the very bytes the
    access log line was made of (encoded once for both). The export side decodes and names them
    (`attributes_of`), which is where that work belongs: off the gateway's CPU."""

    name: str
    kind: int                 # opentelemetry.trace.SpanKind value
    trace_id: str             # 32 hex digits
    span_id: str              # 16 hex digits
    parent_id: str | None     # 16 hex digits; None for a root span
    parent_remote: bool       # the parent came in a traceparent header
    trace_state: str | None   # the incoming tracestate header, passed on unchanged
    start_ns: int
    end_ns: int
    error: str | None = None  # None: status unset; else ERROR with this description ("" for none)
    http: tuple[str, str, str, int] | None = None  # method, route, path, status
    # operation, model, stream, server address, port, attempt, max_tokens, temperature
    upstream: tuple[str, str, bool, str, int | None, int, int | None, float | None] | None = None
    request: bytes | None = None  # RequestRecord, JSON (`encode_request`)


_request_decoder = msgspec.json.Decoder(RequestRecord)


def _request_attributes(attrs: dict[str, Any], r: RequestRecord) -> None:
    attrs["specroute.backend"] = r.backend
    attrs["specroute.strategy"] = r.strategy
    attrs["specroute.policy"] = r.policy
    attrs["specroute.decision.reason"] = r.reason
    attrs["specroute.domain"] = r.domain
    attrs["specroute.inflight_at_dispatch"] = r.inflight
    attrs["gen_ai.usage.input_tokens"] = r.prompt_tokens
    attrs["gen_ai.usage.output_tokens"] = r.completion_tokens
    for key, value in (
        ("specroute.decision.score", r.score), ("gen_ai.response.id", r.response_id),
        ("gen_ai.response.model", r.response_model), ("gen_ai.response.time_to_first_chunk", r.ttft_s),
        ("specroute.accept_length", r.accept_length), ("specroute.verify_count", r.verify_ct),
        ("specroute.decode_tok_s", r.decode_tok_s), ("specroute.baseline_tok_s", r.baseline_tok_s),
        ("specroute.speedup", r.speedup), ("specroute.queue_s", r.queue_s),
    ):
        if value is not None:
            attrs[key] = value
    if r.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = (r.finish_reason,)
    if r.error:
        attrs["error.type"] = r.error_type or "error"


def attributes_of(r: SpanRecord) -> dict[str, Any]:
    """The span's attributes with their semantic-convention names (HTTP, GenAI) and specroute's."""
    attrs: dict[str, Any] = {}
    if r.http is not None:
        method, route, path, status = r.http
        attrs.update({"http.request.method": method, "http.route": route, "url.path": path,
                      "http.response.status_code": status})
    if r.upstream is not None:
        op, model, stream, host, port, attempt, max_tokens, temperature = r.upstream
        attrs.update({"gen_ai.operation.name": op, "gen_ai.provider.name": "sglang", "gen_ai.request.model": model,
                      "gen_ai.request.stream": stream, "server.address": host, "specroute.attempt": attempt})
        if port is not None:
            attrs["server.port"] = port
        if max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = max_tokens
        if temperature is not None:
            attrs["gen_ai.request.temperature"] = temperature
    if r.request is not None:
        _request_attributes(attrs, _request_decoder.decode(r.request))
    return attrs


def to_readable(records: Iterable[SpanRecord], resource: Resource) -> list[ReadableSpan]:
    out: list[ReadableSpan] = []
    for r in records:
        trace_id = int(r.trace_id, 16)
        state = TraceState.from_header([r.trace_state]) if r.trace_state else None
        context = SpanContext(trace_id, int(r.span_id, 16), False, _SAMPLED, state)
        parent = (SpanContext(trace_id, int(r.parent_id, 16), r.parent_remote, _SAMPLED, state)
                  if r.parent_id else None)
        status = _UNSET if r.error is None else Status(StatusCode.ERROR, r.error or None)
        out.append(ReadableSpan(
            name=r.name, context=context, parent=parent, resource=resource, attributes=attributes_of(r),
            kind=_KINDS.get(r.kind, SpanKind.INTERNAL), status=status, start_time=r.start_ns, end_time=r.end_ns,
            instrumentation_scope=SCOPE))
    return out
