"""The span exporter process (`python -m gateway.span_export`): msgpack frames of trace records in on
its stdin, OTLP/HTTP requests out to a collector, encoded by the SDK's own exporter, in batches by
size and by delay."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource

from gateway.config import TracingSection
from gateway.records import RequestRecord, encode_request
from gateway.spans import ClientRecord, TraceRecord, expand, to_readable
from tests.support import wait_until

RESOURCE = Resource.create({"service.name": "specroute-test", "deployment.environment": "ci"})


def _ids(rng: random.Random) -> tuple[str, str, str]:
    return f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}", f"{rng.getrandbits(64):016x}"


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
        server = (
            tid,
            sid,
            f"{rng.getrandbits(64):016x}" if remote else None,
            state,
            start,
            start + rng.getrandbits(30),
            ("POST", "/v1/chat/completions" if i % 10 else "/admin/backends/k26-ar/drain", 500 if i % 7 == 0 else 200),
        )
        failed = i % 4 == 1
        record = RequestRecord(
            request_id=f"{i:032x}",
            model="kimi-k2.6",
            kind="chat",
            stream=bool(i % 2),
            status=502 if failed else 200,
            duration_s=rng.random(),
            trace_id=tid,
            backend=f"k26-{'eagle3' if i % 2 else 'ar'}",
            strategy="eagle3",
            policy="goodput",
            reason="latency",
            score=rng.random() * 100 if i % 3 else None,
            domain="math",
            inflight=rng.randrange(64),
            attempt=1 + i % 2,
            prompt_tokens=rng.randrange(10_000),
            completion_tokens=0 if failed else rng.randrange(4096),
            ttft_s=None if failed else rng.random(),
            accept_length=None if failed else 1 + rng.random() * 3,
            verify_ct=None if failed else rng.randrange(500),
            decode_tok_s=None if failed else rng.random() * 300,
            baseline_tok_s=None if failed else 80.0,
            speedup=None if failed else rng.random() * 3,
            finish_reason=None if failed else "stop",
            response_id=None if failed else f"chatcmpl-{i}",
            response_model="kimi-k2.6 ✓",
            error="backend unreachable" if failed else None,
            error_type="connect" if failed else None,
            queue_s=rng.random() / 100,
            max_tokens=None if i % 4 == 0 else -5 if i % 9 == 0 else 2**40,
            temperature=None if i % 3 == 0 else 0.7,
        )
        out.append(
            TraceRecord(
                *server,
                [
                    ClientRecord(
                        cid,
                        start + 1000,
                        start + 2000,
                        record.error if failed else None,
                        ("10.0.0.7", None if i % 6 == 0 else 30000 + i),
                        encode_request(
                            record
                            if i % 8
                            else RequestRecord(
                                request_id="x", model="m", kind="completion", stream=False, status=200, duration_s=0.0
                            )
                        ),
                    )
                ],
            )
        )
    return out


def _parsed(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


class _Collector:
    """An OTLP/HTTP receiver on a free loopback port that keeps every request it gets, parsed."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, ExportTraceServiceRequest]] = []
        collector = self

        class Receiver(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                collector.messages.append((self.path, _parsed(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def spans(self) -> list:
        return [span for _, m in self.messages for rs in m.resource_spans for ss in rs.scope_spans for span in ss.spans]


def _exporter_process(collector: _Collector, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.span_export", msgspec.json.encode(TracingSection(exporter="otlp")).decode()],
        stdin=subprocess.PIPE,
        env=dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_SERVICE_NAME="specroute-test", **env),
    )


def _send(proc: subprocess.Popen, traces: list[TraceRecord]) -> None:
    payload = msgspec.msgpack.encode(traces)
    proc.stdin.write(struct.pack("<I", len(payload)) + payload)
    proc.stdin.flush()


def test_the_exporter_process_sends_the_sdk_encoders_message():
    """Every span of every record shape reaches the collector as the SDK encodes it: same ids,
    times, kinds, parents, status, flags and attributes, under the configured service name."""
    collector = _Collector()
    traces = _traces(random.Random(7))
    proc = _exporter_process(collector)
    try:
        _send(proc, traces)
    finally:
        proc.stdin.close()  # EOF: the process exports what it holds and exits
        assert proc.wait(300) == 0  # a loaded 2-core VM can take long to start it
        collector.server.shutdown()
    expected = encode_spans(to_readable(expand(traces), Resource.create({"service.name": "specroute-test"})))
    assert [path for path, _ in collector.messages] == ["/v1/traces"]
    (message,) = (m for _, m in collector.messages)
    got = {span.span_id: span for span in collector.spans()}
    want = {span.span_id: span for rs in expected.resource_spans for ss in rs.scope_spans for span in ss.spans}
    assert len(got) == len(want) == 80  # 40 SERVER + 40 CLIENT spans
    for span_id, span in want.items():
        assert got[span_id] == span, f"{got[span_id]}\n!=\n{span}"
    service = {kv.key: kv.value.string_value for kv in message.resource_spans[0].resource.attributes}
    assert service["service.name"] == "specroute-test"


def test_the_exporter_process_batches_by_size_and_by_delay():
    """Frames of 4 spans on the pipe, OTEL_BSP_MAX_EXPORT_BATCH_SIZE=5: no request to the collector
    holds more than 5 spans, and every span arrives while the pipe is still open (the delay)."""
    collector = _Collector()
    proc = _exporter_process(collector, OTEL_BSP_SCHEDULE_DELAY="50", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="5")
    try:
        traces = _traces(random.Random(1))[:6]  # 12 spans, in frames of 4
        for i in range(0, 6, 2):
            _send(proc, traces[i : i + 2])
        assert wait_until(lambda: len(collector.spans()) == 12, timeout=60)
        sizes = [sum(len(ss.spans) for rs in m.resource_spans for ss in rs.scope_spans) for _, m in collector.messages]
        assert max(sizes) <= 5
    finally:
        proc.stdin.close()
        proc.wait(60)
        collector.server.shutdown()


def test_a_bad_frame_is_dropped_and_the_next_one_still_exported():
    collector = _Collector()
    proc = _exporter_process(collector, OTEL_BSP_SCHEDULE_DELAY="50")
    try:
        garbage = b"\xc1not msgpack"
        proc.stdin.write(struct.pack("<I", len(garbage)) + garbage)
        _send(proc, _traces(random.Random(2))[:1])
        assert wait_until(lambda: len(collector.spans()) == 2, timeout=60)
    finally:
        proc.stdin.close()
        assert proc.wait(300) == 0  # a loaded 2-core VM can take long to start it
        collector.server.shutdown()


def test_span_names_use_the_route_so_that_there_are_few_of_them():
    from gateway.spans import route_template

    assert route_template("/v1/responses/resp_55df0a") == "/v1/responses/{response_id}"
    assert route_template("/v1/responses/resp_55df0a/cancel") == "/v1/responses/{response_id}/cancel"
    assert route_template("/admin/backends/k26-ar/drain") == "/admin/backends/{name}/drain"
    assert route_template("/v1/responses") == "/v1/responses"  # no parameter: the path is the route
    assert route_template("/admin/backends") == "/admin/backends"
