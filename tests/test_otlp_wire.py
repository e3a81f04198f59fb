"""The exporter process's own OTLP encoding (`gateway.otlp_wire`) against the SDK's encoder: the same
records must give the same `ExportTraceServiceRequest`, message for message."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest
from opentelemetry.exporter.otlp.proto.common._internal import _encode_value
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from gateway.config import TracingSection
from gateway.otlp_wire import TraceRequestEncoder, _any_value
from gateway.records import RequestRecord, encode_request
from gateway.span_export import build_exporter, wire_sender
from gateway.spans import ClientRecord, SpanRecord, TraceRecord, expand, to_readable
from tests.support import wait_until

RESOURCE = Resource.create({"service.name": "specroute-test", "deployment.environment": "ci"})


def _ids(rng: random.Random) -> tuple[str, str, str]:
    return "%032x" % rng.getrandbits(128), "%016x" % rng.getrandbits(64), "%016x" % rng.getrandbits(64)


def _traces(rng: random.Random) -> list[TraceRecord]:
    """Every shape a record takes: root and remote-parent SERVER spans, CLIENT spans with a full,
    a failed and a bare request record, a route with a parameter, optional fields present and
    absent, a tracestate with an invalid entry, errors with and without a message, negative and
    large numbers, non-ASCII text."""
    out = []
    for i in range(40):
        tid, sid, cid = _ids(rng)
        remote = i % 3 == 0
        state = "vendor=abc,bad entry,other=1" if i % 5 == 0 else None
        start = 1_760_000_000_000_000_000 + rng.getrandbits(40)
        server = (tid, sid, "%016x" % rng.getrandbits(64) if remote else None, state, start,
                  start + rng.getrandbits(30),
                  ("POST", "/v1/chat/completions" if i % 10 else "/admin/backends/k26-ar/drain",
                   500 if i % 7 == 0 else 200))
        failed = i % 4 == 1
        record = RequestRecord(
            request_id="%032x" % i, model="kimi-k2.6", kind="chat", stream=bool(i % 2), status=502 if failed else 200,
            duration_s=rng.random(), trace_id=tid, backend=f"k26-{'eagle3' if i % 2 else 'ar'}", strategy="eagle3",
            policy="goodput", reason="latency", score=rng.random() * 100 if i % 3 else None, domain="math",
            inflight=rng.randrange(64), attempt=1 + i % 2, prompt_tokens=rng.randrange(10_000),
            completion_tokens=0 if failed else rng.randrange(4096), ttft_s=None if failed else rng.random(),
            accept_length=None if failed else 1 + rng.random() * 3, verify_ct=None if failed else rng.randrange(500),
            decode_tok_s=None if failed else rng.random() * 300, baseline_tok_s=None if failed else 80.0,
            speedup=None if failed else rng.random() * 3, finish_reason=None if failed else "stop",
            response_id=None if failed else f"chatcmpl-{i}", response_model="kimi-k2.6 ✓",
            error="backend unreachable" if failed else None, error_type="connect" if failed else None,
            queue_s=rng.random() / 100, max_tokens=None if i % 4 == 0 else -5 if i % 9 == 0 else 2**40,
            temperature=None if i % 3 == 0 else 0.7)
        out.append(TraceRecord(*server, [ClientRecord(
            cid, start + 1000, start + 2000, record.error if failed else None,
            ("10.0.0.7", None if i % 6 == 0 else 30000 + i),
            encode_request(record if i % 8 else RequestRecord(request_id="x", model="m", kind="completion",
                                                              stream=False, status=200, duration_s=0.0)))]))
    return out


def _records(rng: random.Random) -> list[SpanRecord]:
    return expand(_traces(rng))


def _parsed(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


def test_the_wire_encoding_is_the_sdk_encoders_message():
    records = _records(random.Random(7))
    ours = _parsed(TraceRequestEncoder(RESOURCE).request(records))
    sdk = encode_spans(to_readable(records, RESOURCE))
    assert len(ours.resource_spans[0].scope_spans[0].spans) == len(records)
    for mine, theirs in zip(ours.resource_spans[0].scope_spans[0].spans, sdk.resource_spans[0].scope_spans[0].spans):
        assert mine == theirs, f"{mine}\n!=\n{theirs}"
    assert ours == sdk


def test_cached_pairs_stay_bounded_and_correct(monkeypatch):
    monkeypatch.setattr("gateway.otlp_wire._MAX_CACHED_PAIRS", 8)
    encoder = TraceRequestEncoder(RESOURCE)
    records = _records(random.Random(3))
    for _ in range(3):  # the cache fills, is cleared and refills: every batch still right
        assert _parsed(encoder.request(records)) == encode_spans(to_readable(records, RESOURCE))
        assert len(encoder._attributes._pairs) <= 8 and len(encoder._attributes._ints) <= 8


def test_an_int_and_a_bool_of_equal_value_keep_their_own_encodings():
    """(key, 1) == (key, True) as dict keys: ints are cached apart from bools."""
    encoder = TraceRequestEncoder(RESOURCE)
    for value in (1, True, 1, True, 0, False):
        parsed = KeyValue()
        parsed.ParseFromString(encoder._attributes.encode({"k": value})[2:])  # after the field's tag and length
        assert parsed.key == "k" and parsed.value == _encode_value(value)


@pytest.mark.parametrize("value", [True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, -0.0, "", "é", b"\x00\xff", None,
                                   ("a", 1, 2.5, True), []])
def test_any_value_matches_protobuf(value):
    mine = AnyValue()
    mine.ParseFromString(_any_value(value))
    assert mine == _encode_value(value)


def test_unsupported_attribute_values_are_refused():
    with pytest.raises(TypeError):
        _any_value({"a": 1})


def test_the_otlp_http_exporter_gets_the_wire_path_and_others_the_sdk_spans(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    otlp = build_exporter(TracingSection(exporter="otlp"))
    assert callable(wire_sender(otlp))  # the installed SDK still has the client this relies on
    assert wire_sender(ConsoleSpanExporter()) is None


def test_the_exporter_process_batches_by_size_and_by_delay(tmp_path):
    """Frames of 4 spans on the pipe, OTEL_BSP_MAX_EXPORT_BATCH_SIZE=5: no request to the collector
    holds more than 5 spans, and every span arrives while the pipe is still open (the delay)."""
    sizes: list[int] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            message = _parsed(self.rfile.read(int(self.headers["Content-Length"])))
            sizes.append(sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
               OTEL_BSP_SCHEDULE_DELAY="50", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="5")
    proc = subprocess.Popen([sys.executable, "-m", "gateway.span_export",
                             msgspec.json.encode(TracingSection(exporter="otlp")).decode()], stdin=subprocess.PIPE, env=env)
    try:
        traces = _traces(random.Random(1))[:6]  # 12 spans, in frames of 4
        for i in range(0, 6, 2):
            payload = msgspec.msgpack.encode(traces[i:i + 2])
            proc.stdin.write(struct.pack("<I", len(payload)) + payload)
            proc.stdin.flush()
        assert wait_until(lambda: sum(sizes) == 12, timeout=10)
        assert max(sizes) <= 5
    finally:
        proc.stdin.close()
        proc.wait(10)
        server.shutdown()
