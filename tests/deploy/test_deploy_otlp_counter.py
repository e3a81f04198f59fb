"""deploy/local/otlp_counter.py, the Jaeger stand-in of compose.local.yml, fed by the real OpenTelemetry
OTLP/HTTP exporter (protobuf), by OTLP JSON, and by bodies it must refuse."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from tests.support import REPO


def _counter():
    path = REPO / "deploy" / "local" / "otlp_counter.py"
    spec = importlib.util.spec_from_file_location("deploy_local_otlp_counter", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


otlp_counter = _counter()


@pytest.fixture
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), otlp_counter.make_handler(otlp_counter.Counts()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_counts_the_spans_the_otel_exporter_sends(receiver):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver}/v1/traces")))
    tracer = provider.get_tracer("t")
    for i in range(3):
        with tracer.start_as_current_span(f"parent-{i}"), tracer.start_as_current_span("child"):
            pass
    provider.shutdown()
    assert json.loads(_get(f"{receiver}/count")) == {"requests": 6, "spans": 6, "rejected": 0}
    assert "specroute_otlp_counter_spans_total 6\n" in _get(f"{receiver}/metrics")


def test_json_gzip_and_bad_bodies(receiver):
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "a"}, {"name": "b"}]}, {"spans": [{}]}]}]}
    assert _post(f"{receiver}/v1/traces", json.dumps(doc).encode(), {"Content-Type": "application/json"}) == 200
    body = gzip.compress(json.dumps(doc).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    assert _post(f"{receiver}/v1/traces", body, headers) == 200
    protobuf = {"Content-Type": "application/x-protobuf"}
    assert _post(f"{receiver}/v1/traces", b"\x0a\x05\x12\x03", protobuf) == 400  # length past the end
    assert _post(f"{receiver}/v1/traces", b"\x0b", protobuf) == 400  # wire type 3 (groups): not OTLP
    assert _post(f"{receiver}/v1/metrics", b"", protobuf) == 404
    assert json.loads(_get(f"{receiver}/count")) == {"requests": 2, "spans": 6, "rejected": 2}


def test_protobuf_walker_on_hand_made_messages():
    span = b"\x0a\x02ab"  # a Span with trace_id = b"ab"; its content is not looked at
    scope = b"\x12" + bytes([len(span)]) + span
    scope_spans = b"\x0a\x00" + scope + scope  # an empty InstrumentationScope, then two spans
    resource_spans = b"\x0a\x00\x12" + bytes([len(scope_spans)]) + scope_spans + b"\x18\x01"  # + a varint field
    request = (b"\x0a" + bytes([len(resource_spans)]) + resource_spans) * 2
    assert otlp_counter.count_spans_protobuf(request) == 4
    assert otlp_counter.count_spans_protobuf(b"") == 0
