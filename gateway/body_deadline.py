"""The deadline of every request body being read, kept by one timer for all of them.

A client that announces a body and sends it a byte at a time (or never) would hold its connection
and buffer for as long as it likes: its request's task is cancelled once `timeout_s` has passed
since the body's reading began, and the reader answers 408.

Why not `asyncio.timeout` around the read: it arms and cancels a timer per request, 8-10 us on
this 2-core machine under uvloop, against 1.5 us for a dict entry here (the read of a body already
in: 0.3 us), for a deadline almost no request comes near. One callback, scheduled only while bodies
are being read, sweeps them every `SWEEP_S`, so a deadline is kept to within that.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["SWEEP_S", "BodyDeadlines"]

SWEEP_S = 0.25


class BodyDeadlines:
    def __init__(self) -> None:
        self._reading: dict[asyncio.Task[object], tuple[float, int]] = {}  # deadline, cancellations before
        self._expired: dict[asyncio.Task[object], int] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def begin(self, timeout_s: float) -> asyncio.Task[object]:
        """The current task starts reading a body, which must be in within `timeout_s`; returns the
        task, for `end` and `expired`."""
        task = asyncio.current_task()
        assert task is not None, "a body is read inside a task"
        self._reading[task] = (time.monotonic() + timeout_s, task.cancelling())
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(min(SWEEP_S, timeout_s), self._run)
        return task

    def end(self, task: asyncio.Task[object]) -> None:
        self._reading.pop(task, None)
        self._expired.pop(task, None)

    def expired(self, task: asyncio.Task[object]) -> bool:
        """In an `except CancelledError`: True when the cancellation was this deadline's alone,
        which is then undone (the count, as asyncio.timeout keeps it); False when someone else's is
        pending too (the server shutting down), which must go on."""
        before = self._expired.pop(task, None)
        return before is not None and task.uncancel() <= before

    def sweep(self, now: float | None = None) -> None:
        """Cancel every read whose deadline has passed by `now` (time.monotonic())."""
        now = time.monotonic() if now is None else now
        for task, (deadline, before) in list(self._reading.items()):
            if deadline <= now:
                del self._reading[task]
                self._expired[task] = before
                task.cancel()

    def _run(self) -> None:
        self.sweep()
        self._sweep = asyncio.get_running_loop().call_later(SWEEP_S, self._run) if self._reading else None
