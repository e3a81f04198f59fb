"""Admission control: a gateway-wide in-flight cap, per-backend caps, a bounded wait queue.

A request that finds no backend with room waits in its model's FIFO queue until a slot frees or
`queue_timeout_s` passes; if the queue already holds `max_queue` requests it is refused at once.
Both refusals are 429 with `Retry-After`, so memory stays bounded under any load. When no backend
of the model is up at all, waiting is pointless: 503 at once.

Wake-ups are targeted: a released slot wakes the first waiter of that backend's model that could
use that backend (and, when the gateway-wide cap was the limit, the first waiter of every other
model), never the whole queue. A request pinned to a backend, or needing a LoRA adapter only some
backends have loaded, is not woken for a slot it cannot take, so it never holds back the waiters
behind it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Collection
from typing import NamedTuple

from gateway.errors import ApiError
from gateway.pool import Backend, Lease, Pools


class Admission:
    def __init__(self, pools: Pools, *, max_inflight: int, max_queue: int, queue_timeout_s: float) -> None:
        self.pools = pools
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.inflight = 0
        self.waiting = 0
        self.rejected = 0
        # one FIFO per served model, created on first use (models can appear with a reload)
        self._queues: collections.defaultdict[str, collections.deque[_Waiter]] = collections.defaultdict(
            collections.deque
        )
        pools.on_release(self._released)

    async def candidates(
        self,
        model: str,
        pin: str | None = None,
        exclude: Collection[str] = (),
        adapters: frozenset[str] = frozenset(),
    ) -> list[Backend]:
        """Backends of `model` that can take a request now, waiting for room if needed: the pinned
        one if `pin`, those with every LoRA adapter in `adapters` loaded.

        Untried backends (not in `exclude`) are preferred; tried ones are used only when nothing else
        is left, so a retry goes to another member of the pool whenever one exists.
        """
        deadline: float | None = None
        front = False
        while True:
            up = [b for b in self.pools.by_model.get(model, ()) if b.up]
            if pin is not None or adapters:
                up = [b for b in up if _fits(b, pin, adapters)]
            if not up:
                what = f"backend {pin!r}" if pin else f"no backend of model {model!r}"
                if adapters:
                    what += f" with LoRA adapter(s) {sorted(adapters)} loaded"
                raise ApiError(
                    503, f"{what} is available (down, draining or circuit open)", headers={"Retry-After": "1"}
                )
            if self.inflight < self.max_inflight:
                room = [b for b in up if b.has_room]
                if room:
                    return [b for b in room if b.name not in exclude] or room
            if deadline is None:
                deadline = time.monotonic() + self.queue_timeout_s
            await self._wait(model, pin, adapters, deadline, front)
            front = True  # woken but beaten to the slot: keep our place at the head of the queue

    def queued(self, model: str) -> int:
        """Entries in `model`'s FIFO: the waiters, and nothing that has left it."""
        queue = self._queues.get(model)
        return len(queue) if queue is not None else 0

    def lease(self, backend: Backend, sequences: int = 1) -> Lease:
        self.inflight += 1
        return backend.lease(sequences)

    def kick(self) -> None:
        """Capacity may have appeared (a backend became ready): wake one waiter per model."""
        for model in list(self._queues):
            self._wake(model)

    async def _wait(self, model: str, pin: str | None, adapters: frozenset[str], deadline: float, front: bool) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.rejected += 1
            raise ApiError(
                429,
                f"all backends of {model!r} are at capacity; timed out after {self.queue_timeout_s:g}s in the queue",
                headers={"Retry-After": "1"},
            )
        if self.waiting >= self.max_queue:
            self.rejected += 1
            raise ApiError(429, f"gateway queue is full ({self.max_queue} waiting)", headers={"Retry-After": "1"})
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, pin, adapters)
        queue = self._queues[model]
        queue.appendleft(waiter) if front else queue.append(waiter)
        self.waiting += 1
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the future
            # is resolved just as the task is cancelled, losing the cancellation (CPython gh-86296). A
            # request whose client left as a slot came free would then be dispatched for nobody.
            async with asyncio.timeout(remaining):
                await fut
        except TimeoutError:
            self.rejected += 1
            raise ApiError(
                429,
                f"all backends of {model!r} are at capacity; timed out after {self.queue_timeout_s:g}s in the queue",
                headers={"Retry-After": "1"},
            ) from None
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._wake(model)  # woken but leaving (client gone): pass the slot on
            raise
        finally:
            self.waiting -= 1
            # Timed out or cancelled (the task's cancellation cancels the future it awaits): take it
            # out, so the deque holds only live waiters. A woken future was popped already.
            if not fut.done() or fut.cancelled():
                fut.cancel()
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)

    def _released(self, backend: Backend) -> None:
        was_full = self.inflight >= self.max_inflight
        self.inflight -= 1
        self._wake(backend.spec.model, backend)
        if was_full:
            for model in list(self._queues):
                if model != backend.spec.model:
                    self._wake(model)

    def _wake(self, model: str, freed: Backend | None = None) -> None:
        """Wake the first live waiter of `model` that could use `freed` (None: any backend)."""
        queue = self._queues.get(model)
        if queue is None:
            return
        i = 0
        while i < len(queue):
            waiter = queue[i]
            if waiter.future.done():  # popped and resolved, or left: drop it
                del queue[i]
            elif freed is None or _fits(freed, waiter.pin, waiter.adapters):
                del queue[i]
                waiter.future.set_result(None)
                return
            else:
                i += 1


class _Waiter(NamedTuple):
    """One request in a model's queue, and which of its backends it can take."""

    future: asyncio.Future[None]
    pin: str | None
    adapters: frozenset[str]


def _fits(backend: Backend, pin: str | None, adapters: frozenset[str]) -> bool:
    return (pin is None or backend.name == pin) and adapters <= backend.adapters
