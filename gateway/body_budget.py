"""The bytes of request bodies the gateway holds while it receives and reads them, bounded.

A body costs its size as it arrives, and a few times more while it is decoded; with no bound, a
few clients sending large bodies at once could take the process's memory, which in a pod is a
hard limit. So receiving and reading a body takes a share of a fixed budget
(`gateway.max_body_bytes_in_flight`), given back once the request has been read:

- a body whose size is announced (`content-length`) reserves it before its first byte is read,
  waiting its turn (first come, first served) while the budget is used by others. Its bytes stay
  in the client's socket meanwhile, not in the gateway;
- a body sent in chunks takes its bytes as they come, and is refused (503) if one would overrun
  the budget: it cannot wait halfway, holding what it took, for others that may wait on it.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["BodyBudget", "Reservation"]


class BodyBudget:
    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int) -> None:
        """`size` bytes, waiting for them (a caller cancelled while waiting takes nothing)."""
        if not self._waiting and self.used + size <= self.total:
            self.used += size
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiting.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():  # granted as it was cancelled: give it back
                self.release(size)
            else:
                self._waiting.remove(entry)
                self._grant()  # a smaller request behind it may fit now
            raise

    def take(self, size: int) -> bool:
        """`size` more bytes now, if the budget has them (no waiting)."""
        if self.used + size > self.total:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.total:
            size, future = self._waiting.popleft()
            if not future.done():
                self.used += size
                future.set_result(None)


class Reservation:
    """Bytes of the budget held for one body: `reserve` waits for them, `grow` takes more without
    waiting (a body sent in chunks), `release` gives all back, once."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self._budget: BodyBudget | None = budget
        self.size = 0

    def take(self, size: int) -> bool:
        """`size` bytes now if the budget has them and nobody waits for room before this."""
        budget = self._budget
        if budget is None or budget._waiting or budget.used + size > budget.total:
            return False
        budget.used += size
        self.size += size
        return True

    async def reserve(self, size: int) -> None:
        """`size` bytes, waiting for them behind those who wait (`take` first: it costs no task switch)."""
        if self._budget is not None:
            await self._budget.acquire(size)
            self.size += size

    def grow(self, size: int) -> bool:
        budget = self._budget
        if budget is None or not budget.take(size):
            return False
        self.size += size
        return True

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.used -= self.size
            if budget._waiting:
                budget._grant()
