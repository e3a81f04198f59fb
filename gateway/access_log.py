"""One JSON line per request: joinable with loadgen results (request id) and traces (trace id).
No secrets ever; prompt text only when `logging.include_prompts` is on.

The line is encoded by msgspec on the request path and handed to a writer thread through a
bounded queue: a slow or undrained stderr (a full pipe) can never block the event loop. When the
queue is full, lines are dropped and counted rather than held in memory.

Lines are handed over in batches, at most `flush_s` after the first of them: waking the writer
thread for every line made the two threads trade the GIL on every request, which cost more than
encoding the line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time

import msgspec

from gateway.records import RequestRecord, encode_request

_encoder = msgspec.json.Encoder()


class AccessLog:
    def __init__(self, enabled: bool = True, fd: int = 2, max_pending: int = 10_000, flush_s: float = 0.05) -> None:
        self.enabled = enabled
        self.fd = fd
        self.dropped = 0
        self.max_pending = max_pending
        self.flush_s = flush_s
        self._queue: queue.Queue[tuple[bytes, int]] = queue.Queue()
        self._queued = 0  # lines handed to the writer and not yet written
        self._batch: list[bytes] = []
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> bytes | None:
        """Queues the record's line; returns the record's JSON (the CLIENT span carries the same
        bytes), or None when no line was made (logging off, or the queue full)."""
        if not self.enabled:
            return None
        if len(self._batch) + self._queued >= self.max_pending:
            self.dropped += 1
            return None
        body = encode_request(record)
        self._append(b"request", body)
        return body

    def event(self, name: str, record: msgspec.Struct) -> None:
        """Queues one line of another event than a request's (`{"ts", "event": name, ...record}`)."""
        if not self.enabled:
            return
        if len(self._batch) + self._queued >= self.max_pending:
            self.dropped += 1
            return
        self._append(name.encode(), _encoder.encode(record))

    def _append(self, event: bytes, body: bytes) -> None:
        self._batch.append(b'{"ts":%.3f,"event":"%s",' % (time.time(), event) + body[1:] + b"\n")
        if len(self._batch) == 1:
            try:
                asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:  # no event loop (direct use): hand it over now
                self.flush()

    def flush(self) -> None:
        """Hand the pending lines to the writer thread."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="access-log", daemon=True)
            self._thread.start()
        with self._lock:
            self._queued += len(batch)
        self._queue.put_nowait((b"".join(batch), len(batch)))

    def close(self, timeout: float = 2.0) -> None:
        """Flush and wait (briefly) for the writer: lines of the last requests are not lost at shutdown."""
        self.flush()
        deadline = time.monotonic() + timeout
        while self._queued and time.monotonic() < deadline:
            time.sleep(0.005)

    def _drain(self) -> None:
        while True:
            data, lines = self._queue.get()
            with contextlib.suppress(OSError):  # a closed stderr must not fail anything
                os.write(self.fd, data)
            with self._lock:
                self._queued -= lines
