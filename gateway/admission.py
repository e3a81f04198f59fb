"""Admission control: a gateway-wide in-flight cap, per-backend caps, a bounded wait queue.

A request that finds no backend with room waits in its model's queue until a slot frees or
`queue_timeout_s` passes; if the queues already hold `max_queue` requests it is refused at once.
Both refusals are 429 with `Retry-After`, so memory stays bounded under any load. When no backend
of the model is up at all, waiting is pointless: 503 at once.

The queue is ordered by the request's `priority` as SGLang orders its own waiting queue under
`--enable-priority-scheduling` (`srt/managers/schedule_policy.py`, `_sort_by_priority_and_fcfs`):
a higher value first (or a lower one, `priority_order = "low_first"`), first come first served
within a priority. A full queue turns away its least-preferred waiter, the newest of the lowest
priority, when a strictly better request arrives, as SGLang's `_abort_on_queued_limit` does.

Wake-ups are targeted: a released slot wakes the first waiter of that backend's model that could
use that backend (and, when the gateway-wide cap was the limit, the first waiter of every other
model), never the whole queue. A request pinned to a backend, needing a LoRA adapter only some
backends have loaded, or needing room for more sequences (`n`) than the slot gives, is not woken
for a slot it cannot take, so it never holds back the waiters behind it.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
import time
from collections.abc import Collection
from typing import NamedTuple

from gateway.config import PriorityOrder
from gateway.errors import ApiError
from gateway.pool import Backend, Lease, Pools


class Admission:
    def __init__(
        self,
        pools: Pools,
        *,
        max_inflight: int,
        max_queue: int,
        queue_timeout_s: float,
        priority_order: PriorityOrder = "high_first",
        default_priority: int = 0,
    ) -> None:
        self.pools = pools
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.priority_order: PriorityOrder = priority_order
        self.default_priority = default_priority
        self.inflight = 0
        self.waiting = 0
        self.rejected = 0
        # one queue per served model, best rank first, created on first use (models can appear with a reload)
        self._queues: collections.defaultdict[str, collections.deque[_Waiter]] = collections.defaultdict(
            collections.deque
        )
        self._arrivals = itertools.count()  # tells the newest of equal waiters across models
        pools.on_release(self._released)

    async def candidates(
        self,
        model: str,
        pin: str | None = None,
        exclude: Collection[str] = (),
        adapters: frozenset[str] = frozenset(),
        priority: int | None = None,
        sequences: int = 1,
    ) -> list[Backend]:
        """Backends of `model` that can take a request of `sequences` (its `n`) now, waiting for
        room if needed: the pinned one if `pin`, those with every LoRA adapter in `adapters` loaded.
        A request that waits is placed by its `priority` (None: `default_priority`).

        Untried backends (not in `exclude`) are preferred; tried ones are used only when nothing else
        is left, so a retry goes to another member of the pool whenever one exists.
        """
        deadline: float | None = None
        front = False
        rank = arrival = 0
        while True:
            members = self.pools.by_model.get(model, ())
            up = [b for b in members if b.up]
            if not up:  # panic: only open circuits keep the rest out, and they go in (Envoy's panic routing)
                up = [b for b in members if b.serving]
            if pin is not None or adapters:
                up = [b for b in up if _fits(b, pin, adapters)]
            if not members and (why := self.pools.why_empty.get(model)) is not None:
                raise ApiError(503, f"model {model!r} has no backend: {why}", headers={"Retry-After": "1"})
            if not up:
                loaded = f" with LoRA adapter(s) {sorted(adapters)} loaded" if adapters else ""
                what = f"backend {pin!r}{loaded} is not" if pin else f"no backend of model {model!r}{loaded} is"
                raise ApiError(503, f"{what} available (down, draining or circuit open)", headers={"Retry-After": "1"})
            if self.inflight < self.max_inflight:
                room = [b for b in up if b.has_room_for(sequences)]
                if room:
                    return [b for b in room if b.name not in exclude] or room
            if deadline is None:
                deadline = time.monotonic() + self.queue_timeout_s
                rank, arrival = self._rank(priority), next(self._arrivals)
            waiter = _Waiter(asyncio.get_running_loop().create_future(), pin, adapters, rank, arrival, sequences)
            await self._wait(model, waiter, deadline, front)
            front = True  # woken but beaten to the slot: keep our place at the head of the queue

    def queued(self, model: str) -> int:
        """Entries in `model`'s queue: the waiters, and nothing that has left it."""
        queue = self._queues.get(model)
        return len(queue) if queue is not None else 0

    def lease(self, backend: Backend, sequences: int = 1) -> Lease:
        self.inflight += 1
        return backend.lease(sequences)

    def kick(self) -> None:
        """Capacity may have appeared (a backend became ready): wake one waiter per model."""
        for model in list(self._queues):
            self._wake(model)

    def _rank(self, priority: int | None) -> int:
        """The waiter's place: a higher rank is served first."""
        if self.priority_order == "fifo":
            return 0
        value = self.default_priority if priority is None else priority
        return value if self.priority_order == "high_first" else -value

    async def _wait(self, model: str, waiter: _Waiter, deadline: float, front: bool) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.rejected += 1
            raise ApiError(
                429,
                f"all backends of {model!r} are at capacity; timed out after {self.queue_timeout_s:g}s in the queue",
                headers={"Retry-After": "1"},
            )
        if self.waiting >= self.max_queue and not self._turn_away_below(waiter.rank):
            self.rejected += 1
            raise ApiError(429, f"gateway queue is full ({self.max_queue} waiting)", headers={"Retry-After": "1"})
        fut = waiter.future
        queue = self._queues[model]
        _place(queue, waiter, front)
        self.waiting += 1
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the future
            # is resolved just as the task is cancelled, losing the cancellation (CPython gh-86296). A
            # request whose client left as a slot came free would then be dispatched for nobody.
            async with asyncio.timeout(remaining):
                woken = await fut
        except TimeoutError:
            self.rejected += 1
            raise ApiError(
                429,
                f"all backends of {model!r} are at capacity; timed out after {self.queue_timeout_s:g}s in the queue",
                headers={"Retry-After": "1"},
            ) from None
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.result():
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
        if not woken:
            self.rejected += 1
            raise ApiError(
                429,
                f"gateway queue is full ({self.max_queue} waiting): a request of higher priority took this one's place",
                headers={"Retry-After": "1"},
            )

    def _turn_away_below(self, rank: int) -> bool:
        """Make room in a full queue for a request of `rank`: turn away the least-preferred waiter
        of every model's queue (its newest of the lowest rank) if it ranks strictly lower. True if
        one was turned away."""
        worst: collections.deque[_Waiter] | None = None
        for queue in self._queues.values():
            while queue and queue[-1].future.done():  # resolved or left, not yet removed
                queue.pop()
            if queue and queue[-1].rank < rank and (worst is None or _worse(queue[-1], worst[-1])):
                worst = queue
        if worst is None:
            return False
        worst.pop().future.set_result(False)
        return True

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
            elif freed is None or (_fits(freed, waiter.pin, waiter.adapters) and freed.has_room_for(waiter.sequences)):
                del queue[i]
                waiter.future.set_result(True)
                return
            else:
                i += 1


class _Waiter(NamedTuple):
    """One request in a model's queue, which of its backends it can take, and its rank. Its future
    resolves True when a slot is its to take, False when a better request took its place."""

    future: asyncio.Future[bool]
    pin: str | None
    adapters: frozenset[str]
    rank: int
    arrival: int
    sequences: int = 1  # it needs room for this many (`n`); a smaller request behind it may go first


def _worse(a: _Waiter, b: _Waiter) -> bool:
    """`a` is turned away before `b`: a lower rank, or the same and newer."""
    return (a.rank, -a.arrival) < (b.rank, -b.arrival)


def _place(queue: collections.deque[_Waiter], waiter: _Waiter, front: bool) -> None:
    """Insert by rank, best first: behind its equals, or ahead of them when `front` (a woken waiter
    that was beaten to the slot keeps its place)."""
    insert_at = bisect.bisect_left if front else bisect.bisect_right
    queue.insert(insert_at(queue, -waiter.rank, key=_descending_rank), waiter)


def _descending_rank(waiter: _Waiter) -> int:
    return -waiter.rank


def _fits(backend: Backend, pin: str | None, adapters: frozenset[str]) -> bool:
    return (pin is None or backend.name == pin) and adapters <= backend.adapters
