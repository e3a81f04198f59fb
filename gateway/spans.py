"""A finished span as the request path records it, and its conversion to the SDK's ReadableSpan.

The request path never builds OpenTelemetry SDK span objects: a `SpanRecord` is a plain struct
(ids as hex, times in ns, attributes as a dict) that msgspec encodes in about a microsecond.
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

SCOPE = InstrumentationScope("specroute")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)  # only sampled spans are recorded
_KINDS = {k.value: k for k in SpanKind}
_UNSET = Status(StatusCode.UNSET)


class SpanRecord(msgspec.Struct, array_like=True, gc=False):
    """One finished, sampled span. `array_like`: encoded as a msgpack array, no field names."""

    name: str
    kind: int                 # opentelemetry.trace.SpanKind value
    trace_id: str             # 32 hex digits
    span_id: str              # 16 hex digits
    parent_id: str | None     # 16 hex digits; None for a root span
    parent_remote: bool       # the parent came in a traceparent header
    trace_state: str | None   # the incoming tracestate header, passed on unchanged
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None = None  # None: status unset; else ERROR with this description ("" for none)


def to_readable(records: Iterable[SpanRecord], resource: Resource) -> list[ReadableSpan]:
    out: list[ReadableSpan] = []
    for r in records:
        trace_id = int(r.trace_id, 16)
        state = TraceState.from_header([r.trace_state]) if r.trace_state else None
        context = SpanContext(trace_id, int(r.span_id, 16), False, _SAMPLED, state)
        parent = (SpanContext(trace_id, int(r.parent_id, 16), r.parent_remote, _SAMPLED, state)
                  if r.parent_id else None)
        # msgpack has no tuples; the SDK keeps sequence attributes as tuples
        attributes = {k: tuple(v) if isinstance(v, list) else v for k, v in r.attributes.items()}
        status = _UNSET if r.error is None else Status(StatusCode.ERROR, r.error or None)
        out.append(ReadableSpan(
            name=r.name, context=context, parent=parent, resource=resource, attributes=attributes,
            kind=_KINDS.get(r.kind, SpanKind.INTERNAL), status=status, start_time=r.start_ns, end_time=r.end_ns,
            instrumentation_scope=SCOPE))
    return out
