"""Span export off the request path: records are batched, then exported by a separate process.

Why a process: the OpenTelemetry Python SDK's work per request, turning two spans into OTLP
protobuf, is many times the gateway's own, and a background thread in the gateway would take it
from the same GIL the requests need (docs/performance.md, Tracing). Here the gateway
msgpack-encodes each traced request's `TraceRecord` (its SERVER and CLIENT spans' raw facts) into
a buffer; every 32 requests or 100 ms the buffer is written to a pipe. The exporter process
(`python -m gateway.span_export`, started with the gateway, ends with it) builds the SDK exporter
the standard way (OTLP over HTTP/protobuf or gRPC, or the console, from the OTEL_* settings) and
batches for the collector as the SDK's batch processor does (OTEL_BSP_SCHEDULE_DELAY,
OTEL_BSP_MAX_EXPORT_BATCH_SIZE). It expands the records into spans (`spans.expand`), makes the SDK's
`ReadableSpan`s of them (`spans.to_readable`) and hands those to the SDK exporter, which encodes
and sends them: the request path never waits for any of it.

Bounded: the pipe write is non-blocking; when the exporter falls behind (a slow or unreachable
collector), at most `max_pending_bytes` wait in the gateway and further batches are dropped and
counted, as the SDK's batch processor drops past its queue size. An unreachable collector costs
the exporter's logged warning and nothing else.

An exporter object given in code (tests' in-memory exporter) is fed by a thread in the gateway's
process instead: same records, same conversion.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Protocol

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from common.json_errors import JSON_DECODE_ERRORS
from gateway.config import TracingSection
from gateway.spans import SpanRecord, TraceRecord, expand, to_readable

log = logging.getLogger("specroute.tracing")

_FRAME = struct.Struct("<I")  # length prefix of one msgpack batch on the pipe
# A frame as the shipper builds it: the length prefix, a msgpack array 32 header (0xdd, count), the
# records; the headers are written into their room when the batch leaves, in place, no copy.
_HEAD_SIZE = _FRAME.size + 5
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[TraceRecord])
_PIPE_SIZE = 1 << 20
EXPORTER_NICE = 10


def exporter_kind(section: TracingSection) -> str:
    """none | otlp | console: OTEL_TRACES_EXPORTER wins; an OTLP endpoint alone turns OTLP on."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER") or section.exporter
    if kind == "none" and (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or section.endpoint):
        kind = "otlp"
    return kind if kind in ("otlp", "console") else "none"


def build_exporter(section: TracingSection) -> SpanExporter | None:
    kind = exporter_kind(section)
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        return None
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or section.protocol
    )
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            log.warning("OTLP over gRPC needs `pip install specroute[grpc]`; using HTTP/protobuf")
        else:
            grpc: SpanExporter = GrpcExporter(endpoint=None if env_endpoint else section.endpoint)
            return grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The exporter reads the env endpoint itself (appending /v1/traces); a config endpoint is a base URL.
    endpoint = None if env_endpoint else (section.endpoint.rstrip("/") + "/v1/traces" if section.endpoint else None)
    return OTLPSpanExporter(endpoint=endpoint, timeout=5)


def resource_for(section: TracingSection) -> Resource:
    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or section.service_name})


class Sink(Protocol):
    dropped: int

    def send(self, frame: bytearray, count: int) -> None: ...
    def pending(self) -> bool: ...
    def flush(self, timeout_s: float) -> bool: ...
    def close(self, timeout_s: float) -> None: ...


class ProcessSink:
    """Writes msgpack batches to the exporter process's stdin without ever blocking the caller."""

    def __init__(self, section: TracingSection, max_pending_bytes: int = 8 << 20) -> None:
        self.dropped = 0
        self._max_pending = max_pending_bytes
        self._pending: collections.deque[bytes | bytearray] = collections.deque()  # whole frames, oldest first
        self._pending_bytes = 0
        self._offset = 0  # bytes of the oldest frame already written
        self._warned = False
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.span_export", msgspec.json.encode(section).decode()],
            stdin=subprocess.PIPE,
            stdout=None,
            stderr=None,
        )
        assert self._proc.stdin is not None
        self._fd = self._proc.stdin.fileno()
        with contextlib.suppress(OSError, AttributeError):  # F_SETPIPE_SZ is Linux's
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)  # fewer, larger writes
        os.set_blocking(self._fd, False)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def send(self, frame: bytearray, count: int) -> None:
        """`frame`: a length-prefixed msgpack array of `count` TraceRecords (`SpanShipper`)."""
        if count:
            if self._pending_bytes + len(frame) > self._max_pending or self._proc.poll() is not None:
                self._drop(spans_in(frame))
            else:
                self._pending.append(frame)
                self._pending_bytes += len(frame)
        self._write()

    def _drop(self, n: int) -> None:
        self.dropped += n
        if not self._warned:
            self._warned = True
            state = "exited" if self._proc.poll() is not None else "falling behind"
            log.warning("span exporter process %s: dropping spans (counted in /admin/backends)", state)

    def _write(self) -> None:
        """As much as the pipe takes now; a partly written frame goes on from where it stopped."""
        pending = self._pending
        while pending:
            head = pending[0]
            try:
                n = os.write(self._fd, memoryview(head)[self._offset :] if self._offset else head)
            except BlockingIOError:
                return
            except OSError:  # the exporter process is gone
                self._drop(0)
                pending.clear()
                self._pending_bytes = self._offset = 0
                return
            self._pending_bytes -= n
            self._offset += n
            if self._offset == len(head):
                pending.popleft()
                self._offset = 0

    def pending(self) -> bool:
        return bool(self._pending)

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline and self._proc.poll() is None:
            self._write()
            if self._pending:
                time.sleep(0.005)
        return not self._pending

    def close(self, timeout_s: float) -> None:
        self.flush(timeout_s)
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.close()  # EOF: the exporter exports the rest, exits
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()


class ThreadSink:
    """Exports with a given exporter on a thread of this process (tests' in-memory exporter)."""

    def __init__(self, exporter: SpanExporter, resource: Resource, max_queue: int = 64) -> None:
        self.dropped = 0
        self.exporter = exporter
        self._resource = resource
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()

    def send(self, frame: bytearray, count: int) -> None:
        if count:
            try:
                self._queue.put_nowait(frame)
            except queue.Full:
                self.dropped += spans_in(frame)

    def pending(self) -> bool:
        return False

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self.exporter.export(
                    to_readable(expand(_decoder.decode(memoryview(item)[_FRAME.size :])), self._resource)
                )
            except Exception as e:  # an exporter's failure must not end the thread
                log.warning("span export failed: %s", e)

    def flush(self, timeout_s: float) -> bool:
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def close(self, timeout_s: float) -> None:
        self.flush(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)
        self.exporter.shutdown()


def spans_in(frame: bytes | bytearray) -> int:
    """How many spans a frame holds (counted for drops only, so not on the way of every batch)."""
    try:
        return sum(t.spans() for t in _decoder.decode(memoryview(frame)[_FRAME.size :]))
    except JSON_DECODE_ERRORS:
        return 0


def _new_frame() -> bytearray:
    return bytearray(_HEAD_SIZE)  # the headers' room


class SpanShipper:
    """Collects finished traces on the event loop and hands them to the sink in batches.

    Each trace is encoded as it ends, into the batch's frame, and dropped: nothing waits in memory
    as objects (which the garbage collector would have to walk and promote). A full frame goes to
    the sink as it is: its headers are written into the room left for them, no copy."""

    def __init__(self, sink: Sink, batch_size: int = 32, delay_s: float = 0.1) -> None:
        self.sink = sink
        # Small batches: the buffer stays in the CPU cache (docs/performance.md, Tracing) and spans
        # reach the exporter process soon; it re-batches for the collector (OTEL_BSP_*).
        self.batch_size = batch_size  # traces (records)
        self.delay_s = delay_s
        self._frame = _new_frame()
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None
        self._encode_into = _encoder.encode_into

    def add(self, record: tuple[Any, ...]) -> None:
        """`record`: a `TraceRecord` as a tuple."""
        self._encode_into(record, self._frame, -1)
        self._count += 1
        if self._count >= self.batch_size:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._tick)
            except RuntimeError:  # no loop (a record made outside the server): send it now
                self.flush()

    def _tick(self) -> None:
        self._timer = None
        self.flush()
        if self.sink.pending():  # the exporter was behind: try the rest on the next tick
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._tick)

    def flush(self) -> None:
        count, frame = self._count, self._frame
        if count:
            self._count, self._frame = 0, _new_frame()
            # length prefix (little-endian), then msgpack array 32: 0xdd and the count, big-endian
            at = _FRAME.size
            _FRAME.pack_into(frame, 0, len(frame) - at)
            frame[at] = 0xDD
            frame[at + 1 : _HEAD_SIZE] = count.to_bytes(4, "big")
        self.sink.send(frame, count)  # count 0: nothing to take, only pending frames to write

    @property
    def dropped(self) -> int:
        return self.sink.dropped

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        self.flush()
        return self.sink.flush(timeout_s)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        self.sink.close(timeout_s)


def _env_number(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        log.warning("%s is not an integer; using %d", name, default)
        return default
    return value if value > 0 else default


class _Frames:
    """Length-prefixed msgpack batches from a pipe, as they arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()

    def read(self) -> list[bytes] | None:
        """The whole frames the pipe has now (blocks until some bytes come); None at end of input."""
        data = os.read(self.fd, _PIPE_SIZE)
        if not data:
            return None
        buf = self._buf
        buf += data
        frames, at = [], 0
        while len(buf) - at >= _FRAME.size:
            size = _FRAME.unpack_from(buf, at)[0]
            if len(buf) - at - _FRAME.size < size:
                break
            frames.append(bytes(buf[at + _FRAME.size : at + _FRAME.size + size]))
            at += _FRAME.size + size
        del buf[:at]
        return frames


def _lower_priority() -> None:
    """Spans are worth less than requests: where this process shares CPUs with the gateway (or its
    neighbours), it runs only when they leave the CPU idle (SCHED_IDLE; niceness where that is
    missing); spans wait in the pipe meanwhile. Called before any thread exists: threads inherit it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(EXPORTER_NICE)


def main(argv: list[str] | None = None) -> int:
    """The exporter process: msgpack batches on stdin -> batches for the collector -> exporter,
    until EOF. Batching follows the SDK's batch processor settings: a batch leaves when it holds
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE spans (512) or OTEL_BSP_SCHEDULE_DELAY ms (5000) after its first
    span. An export runs on this thread: while the collector is slow, spans wait in the pipe and
    then in the gateway's bounded buffer, which drops (and counts) past its limit."""
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s span-exporter: %(message)s")
    section = msgspec.json.decode(argv[0].encode(), type=TracingSection)
    _lower_priority()
    exporter = build_exporter(section)
    if exporter is None:
        return 0
    resource = resource_for(section)

    def export(batch: list[SpanRecord]) -> None:
        try:
            exporter.export(to_readable(batch, resource))
        except Exception as e:  # one failed batch must not end the process
            log.warning("span export failed: %s", e)

    delay_s = _env_number("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
    max_batch = _env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
    # Ctrl-C or SIGTERM to the gateway's process group: keep going until the gateway closes the
    # pipe (or dies, which closes it too), then export what is left. EOF always ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    frames = _Frames(sys.stdin.fileno())
    batch: list[SpanRecord] = []
    due = 0.0
    try:
        while True:
            wait = max(0.0, due - time.monotonic()) if batch else None
            if select.select([frames.fd], [], [], wait)[0]:
                payloads = frames.read()
                if payloads is None:
                    break
                for payload in payloads:
                    try:
                        spans = expand(_decoder.decode(payload))
                    except (msgspec.DecodeError, TypeError, ValueError) as e:  # a bad batch: warn, keep going
                        log.warning("span batch dropped: %s", e)
                        continue
                    if not batch:
                        due = time.monotonic() + delay_s
                    batch += spans
                    while len(batch) >= max_batch:
                        export(batch[:max_batch])
                        del batch[:max_batch]
                        due = time.monotonic() + delay_s
            if batch and time.monotonic() >= due:
                export(batch)
                batch = []
    finally:
        if batch:
            export(batch)
        exporter.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
