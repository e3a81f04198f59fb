"""Span records straight to OTLP/protobuf bytes (an `ExportTraceServiceRequest`), for the exporter process.

Why not the SDK's encoder: it builds a protobuf message object per attribute, about 80 us for a
request's two spans (29 attributes), so the exporter process needed half a CPU to keep up with one
saturated gateway, and its work slowed the processes beside it. Here each span is written in the
protobuf wire format directly, and the attribute pairs that repeat from span to span (operation,
model, backend, route, status, token and in-flight counts, ...) are encoded once and reused.

The message is the one the SDK's encoder makes from the same spans (`spans.to_readable`): same
resource, scope, ids, times, kind, status, flags and attributes (`spans.attributes_of` names them
for both). `tests/test_otlp_wire.py` parses both with the OTLP protobuf classes and compares them.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import TraceState

from gateway.spans import SCOPE, SpanRecord, attributes_of

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
# Span.flags (opentelemetry.proto.trace.v1.SpanFlags): whether the parent is remote is known, and is it.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_STATUS_UNSET = b"\x7a\x00"         # Span.status = Status{} (the SDK always sets the field)
_MAX_CACHED_PAIRS = 4096            # string attribute pairs kept encoded; cleared when full


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: `tag` is (field number << 3) | 2, below 128."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """opentelemetry.proto.common.v1.AnyValue, by the SDK's rules (bool before int, None empty)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement, 10 bytes if < 0
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, (tuple, list)):
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))  # ArrayValue
    raise TypeError(f"attribute value of type {type(value).__name__}")


class _Attributes:
    """KeyValue fields under one tag (Span.attributes = 9, Resource.attributes = 1). String, bool and
    int pairs are kept encoded whole (a bounded cache: the same backend, route, status, token count
    or in-flight count comes back request after request); a float's field is a cached head plus its
    8 bytes."""

    def __init__(self, tag: int) -> None:
        self._tag = bytes((tag,))
        self._pairs: dict[tuple[str, Any], bytes] = {}  # str and bool values
        self._ints: dict[tuple[str, int], bytes] = {}   # apart: (key, 1) == (key, True)
        self._float_heads: dict[str, bytes] = {}

    def _field_of(self, key: str, value: Any) -> bytes:
        pair = _field(0x0A, key.encode()) + _field(0x12, _any_value(value))  # KeyValue{key = 1, value = 2}
        return self._tag + _varint(len(pair)) + pair

    def _cached(self, cache: dict, key: str, value: Any) -> bytes:
        if len(cache) >= _MAX_CACHED_PAIRS:
            cache.clear()
        field = cache[(key, value)] = self._field_of(key, value)
        return field

    def encode(self, attributes: Mapping[str, Any]) -> bytes:
        out = []
        pairs, ints, float_heads = self._pairs, self._ints, self._float_heads
        for key, value in attributes.items():
            kind = type(value)
            if kind is str or kind is bool:
                out.append(pairs.get((key, value)) or self._cached(pairs, key, value))
            elif kind is int:
                out.append(ints.get((key, value)) or self._cached(ints, key, value))
            elif kind is float:
                head = float_heads.get(key)
                if head is None:  # everything before the double's 8 bytes: its length is fixed
                    head = float_heads[key] = self._field_of(key, 0.0)[:-8]
                out.append(head)
                out.append(_DOUBLE.pack(value))
            else:
                out.append(self._field_of(key, value))
        return b"".join(out)


def _trace_state(header: str) -> str:
    """The incoming tracestate as the SDK passes it on: parsed, invalid entries dropped."""
    return ",".join(f"{k}={v}" for k, v in TraceState.from_header([header]).items())


def _scope(scope: InstrumentationScope) -> bytes:
    out = _field(0x0A, scope.name.encode())
    if scope.version:
        out += _field(0x12, scope.version.encode())
    return out


class TraceRequestEncoder:
    """Encodes batches of one resource's span records as `ExportTraceServiceRequest` bytes."""

    def __init__(self, resource: Resource, scope: InstrumentationScope = SCOPE) -> None:
        self._attributes = _Attributes(0x4A)
        self._resource = _field(0x0A, _Attributes(0x0A).encode(resource.attributes))
        self._schema_url = _field(0x1A, resource.schema_url.encode()) if resource.schema_url else b""
        self._scope = _field(0x0A, _scope(scope))

    def span(self, r: SpanRecord) -> bytes:
        """opentelemetry.proto.trace.v1.Span."""
        parts = [b"\x0a\x10", bytes.fromhex(r.trace_id), b"\x12\x08", bytes.fromhex(r.span_id)]
        if r.trace_state and (state := _trace_state(r.trace_state)):
            parts.append(_field(0x1A, state.encode()))
        if r.parent_id:
            parts += (b"\x22\x08", bytes.fromhex(r.parent_id))
        parts += (_field(0x2A, r.name.encode()), b"\x30", _varint(r.kind + 1),  # proto SpanKind = SDK's + 1
                  b"\x39", _FIXED64.pack(r.start_ns), b"\x41", _FIXED64.pack(r.end_ns),
                  self._attributes.encode(attributes_of(r)))
        if r.error is None:
            parts.append(_STATUS_UNSET)
        else:  # Status{message = 2, code = 3: ERROR}
            parts.append(_field(0x7A, (_field(0x12, r.error.encode()) if r.error else b"") + b"\x18\x02"))
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if r.parent_id and r.parent_remote else 0)
        parts += (b"\x85\x01", _FIXED32.pack(flags))  # Span.flags = 16, fixed32
        return b"".join(parts)

    def span_fields(self, records: Iterable[SpanRecord]) -> list[bytes]:
        """Each span as a ScopeSpans.spans field (= 2), ready to be joined into a request."""
        return [_field(0x12, self.span(r)) for r in records]

    def request_of(self, span_fields: Iterable[bytes]) -> bytes:
        """The request holding spans encoded by `span_fields`."""
        resource_spans = self._resource + _field(0x12, self._scope + b"".join(span_fields)) + self._schema_url
        return _field(0x0A, resource_spans)

    def request(self, records: Iterable[SpanRecord]) -> bytes:
        return self.request_of(self.span_fields(records))
