#!/usr/bin/env python3
"""A stand-in OTLP/HTTP trace receiver that counts the spans it is sent, for machines where no tracing
backend image (Jaeger) can be pulled. The local compose override runs it in the specroute image under
the service name `jaeger`, so the gateway's OTEL_EXPORTER_OTLP_ENDPOINT stays http://jaeger:4318.

    POST /v1/traces   ExportTraceServiceRequest, application/x-protobuf (or application/json), gzip or not
    GET  /metrics     Prometheus text: specroute_otlp_counter_{requests,spans,rejected}_total
    GET  /count       {"requests": N, "spans": N, "rejected": N}

It stores nothing but three counters. The protobuf is walked by hand (the OTLP field numbers are
stable: ExportTraceServiceRequest.resource_spans = 1, ResourceSpans.scope_spans = 2, ScopeSpans.spans = 2)
so that it needs only the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 16 * 1024 * 1024  # the OTel SDK's batches are far smaller; a bigger body is refused (413)


class WireError(ValueError):
    """Not a well-formed protobuf message."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise WireError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes, number: int) -> list[bytes]:
    """The payloads of the length-delimited fields `number` of one message; other fields skipped."""
    out: list[bytes] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise WireError("length-delimited field past the end")
            if key >> 3 == number:
                out.append(buf[i : i + size])
            i += size
        else:
            raise WireError(f"wire type {wire} is not used by OTLP")
    if i != len(buf):
        raise WireError("fixed-size field past the end")
    return out


def count_spans_protobuf(body: bytes) -> int:
    return sum(len(fields(scope, 2)) for rs in fields(body, 1) for scope in fields(rs, 2))


def count_spans_json(body: bytes) -> int:
    doc = json.loads(body)
    return sum(len(ss.get("spans", [])) for rs in doc.get("resourceSpans", []) for ss in rs.get("scopeSpans", []))


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.spans = self.rejected = 0

    def add(self, spans: int | None) -> None:
        with self.lock:
            if spans is None:
                self.rejected += 1
            else:
                self.requests += 1
                self.spans += spans

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "spans": self.spans, "rejected": self.rejected}


def make_handler(counts: Counts) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # one line per batch would be noise
            pass

        def _reply(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            snap = counts.snapshot()
            if self.path == "/metrics":
                text = "".join(
                    f"# TYPE specroute_otlp_counter_{k} counter\nspecroute_otlp_counter_{k}_total {v}\n"
                    for k, v in snap.items()
                )
                self._reply(200, text.encode(), "text/plain; version=0.0.4")
            elif self.path == "/count":
                self._reply(200, json.dumps(snap).encode(), "application/json")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/v1/traces":
                self._reply(404, b"not found\n", "text/plain")
                return
            if length > MAX_BODY:
                counts.add(None)
                self.close_connection = True
                self._reply(413, b"body too large\n", "text/plain")
                return
            body = self.rfile.read(length)
            try:
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                json_body = self.headers.get("Content-Type", "").startswith("application/json")
                spans = count_spans_json(body) if json_body else count_spans_protobuf(body)
            except (WireError, ValueError, OSError, AttributeError, TypeError) as e:
                counts.add(None)
                self._reply(400, f"bad OTLP body: {e}\n".encode(), "text/plain")
                return
            counts.add(spans)
            # An empty ExportTraceServiceResponse: zero bytes in protobuf, {} in JSON.
            self._reply(200, b"{}" if json_body else b"", "application/json" if json_body else "application/x-protobuf")

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="otlp_counter", description="Count the spans sent over OTLP/HTTP.")
    p.add_argument(
        "--listen", action="append", default=None, metavar="HOST:PORT", help="repeatable; default 0.0.0.0:4318"
    )
    args = p.parse_args(argv)
    counts = Counts()
    servers = []
    for listen in args.listen or ["0.0.0.0:4318"]:
        host, _, port = listen.rpartition(":")
        servers.append(ThreadingHTTPServer((host, int(port)), make_handler(counts)))
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(f"otlp_counter: listening on {', '.join(args.listen or ['0.0.0.0:4318'])}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        servers[0].serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
