"""One JSON line per request: joinable with loadgen results (request id) and traces (trace id).
No secrets ever; prompt text only when `logging.include_prompts` is on.

The line is encoded by msgspec on the request path and handed to a writer thread through a
bounded queue: a slow or undrained stderr (a full pipe) can never block the event loop. When the
queue is full, lines are dropped and counted rather than held in memory.
"""

from __future__ import annotations

import os
import queue
import threading
import time

import msgspec

from gateway.records import RequestRecord

_encoder = msgspec.json.Encoder()


class AccessLog:
    def __init__(self, enabled: bool = True, fd: int = 2, max_pending: int = 10_000) -> None:
        self.enabled = enabled
        self.fd = fd
        self.dropped = 0
        self._queue: queue.Queue[bytes] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None

    def write(self, record: RequestRecord) -> None:
        if not self.enabled:
            return
        body = _encoder.encode(record)  # omit_defaults: unset fields are left out
        line = b'{"ts":%.3f,"event":"request",' % time.time() + body[1:] + b"\n"
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="access-log", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _drain(self) -> None:
        while True:
            lines = [self._queue.get()]
            while len(lines) < 256:  # batch what is pending into one write
                try:
                    lines.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                os.write(self.fd, b"".join(lines))
            except OSError:
                pass  # a closed stderr must not fail anything
