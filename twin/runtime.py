"""Wall-clock driver of the engine inside the HTTP server.

An asyncio task runs engine steps back to back while there is work, sleeping each step's
simulated duration times `time_scale` against a deadline (so event-loop overhead does not add up
to drift), and hands each step's emissions to per-request channels. Tokens become visible at the
end of the step that produced them, as on a GPU; requests submitted during a step join the next.
Requests the engine aborts on its own (priority scheduling: evicted from a full queue, or
retracted into one) end their channel with reason `abort` and the scheduler's message in
`Channel.error`, at once: SGLang sends those aborts while it schedules (`scheduler.py:
send_abort_output`), not after a forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from twin.engine import Engine, SimRequest

__all__ = ["Channel", "Runtime"]

_MAX_LAG_S = 0.05  # behind schedule by more than this: stop catching up, restart the schedule


class Channel:
    """Emissions of one request, awaited by its HTTP handler."""

    __slots__ = ("_items", "_event", "error")

    def __init__(self) -> None:
        self._items: list[tuple[int, bool, str | None]] = []
        self._event = asyncio.Event()
        # the message of a scheduler abort with status 503 (`scheduler.py: _make_abort_req`)
        self.error: str | None = None

    def push(self, n_tokens: int, finished: bool, reason: str | None) -> None:
        self._items.append((n_tokens, finished, reason))
        self._event.set()

    async def get(self) -> list[tuple[int, bool, str | None]]:
        """Everything emitted since the last call; waits if nothing is pending."""
        while not self._items:
            self._event.clear()
            await self._event.wait()
        items, self._items = self._items, []
        return items


class Runtime:
    """Owns the engine, the step loop task and the channels of in-flight requests."""

    def __init__(self, engine: Engine, time_scale: float = 1.0) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.started_at = time.monotonic()
        # callables(n_tokens) run after each delivery (fault knobs)
        self.on_tokens: list[Callable[[int], None]] = []
        self._channels: dict[str, Channel] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hung = False
        self.last_step_s = 0.0
        # When the engine last finished a step (prefill chunks included): after each batch SGLang's
        # scheduler answers the health checks that arrived meanwhile, its evidence of not being stuck.
        self.last_step_at = time.monotonic()

    def hang(self) -> None:
        """Fault knob: stop stepping for good; in-flight requests never progress."""
        self._hung = True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-step-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, prompt_text: str, **engine_args: Any
    ) -> tuple[SimRequest, Channel]:
        """Queue a request in the engine (may raise QueueFull, ValueError) and open its channel.

        `engine_args` go to Engine.submit (domain, temperature, prefix_blocks, ...).
        """
        engine = self.engine
        req = engine.submit(rid, prompt_tokens, max_new_tokens, prompt_text, **engine_args)
        ch = Channel()
        self._channels[rid] = ch
        self._wake.set()
        if engine.aborted:  # it took the place of a worse waiter (priority scheduling)
            self._end_aborted()
        return req, ch

    def _end_aborted(self) -> None:
        """Tell the clients of the requests the engine aborted on its own."""
        for req in self.engine.take_aborted():
            ch = self._channels.pop(req.rid, None)
            if ch is not None:
                ch.error = req.abort_message
                ch.push(0, True, "abort")

    def abort(self, rid: str) -> bool:
        """Abort a request: free its engine slot and finish its channel with reason `abort`."""
        req = self.engine.abort(rid)
        ch = self._channels.pop(rid, None)
        if ch is not None:
            ch.push(0, True, "abort")
        return req is not None

    def in_flight(self) -> list[str]:
        """Request ids with an open channel (waiting or running)."""
        return list(self._channels)

    def release(self, rid: str) -> None:
        """Forget a finished request's channel (handlers call this on exit, whatever happened)."""
        if self._channels.pop(rid, None) is not None:
            self.engine.abort(rid)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        deadline = loop.time()
        while True:
            if self._hung:
                await asyncio.Event().wait()  # forever, until cancelled at shutdown
            if engine.idle:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            res = engine.step()
            if engine.aborted:  # retracted into a full queue (priority scheduling)
                self._end_aborted()
            self.last_step_s = res.duration_s
            deadline += res.duration_s * self.time_scale
            now = loop.time()
            if deadline > now:
                await asyncio.sleep(deadline - now)
            else:
                if now - deadline > _MAX_LAG_S:
                    deadline = now
                await asyncio.sleep(0)
            channels = self._channels
            delivered = 0
            for rid, n, finished, reason in res.emissions:
                ch = channels.get(rid)
                if ch is None:
                    continue
                if finished:
                    del channels[rid]
                ch.push(n, finished, reason)
                delivered += n
            self.last_step_at = time.monotonic()
            for hook in self.on_tokens:
                hook(delivered)
