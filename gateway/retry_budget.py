"""A retry budget: retries are at most a share of the requests of a recent window.

Retries help when one backend fails and the rest are well; when the failure is the pool's (or the
requests'), each retry is another request on servers already failing, and a retried workload
multiplies its own load by up to `retry.attempts`. Envoy (`retry_budget`), Finagle (`RetryBudget`)
and gRPC (retry throttling) bound that the same way: over the last `window_s`, a retry is allowed
while retries stay below `share` of the requests, plus a floor of `min_per_s` for each second of it
(Finagle's `minRetriesPerSec`), so that a quiet gateway, or one that has just started, can still
retry its failures.

Counted in one-second buckets, so the window slides by whole seconds and memory is a fixed ring.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["RetryBudget"]


class RetryBudget:
    __slots__ = ("share", "min_retries", "_clock", "_seconds", "_requests", "_retries", "_stamp")

    def __init__(
        self, share: float, window_s: float, min_per_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.share = share
        self._clock = clock
        self._seconds = max(1, math.ceil(window_s))
        self.min_retries = min_per_s * self._seconds
        self._requests = [0] * self._seconds
        self._retries = [0] * self._seconds
        self._stamp = int(clock())  # the whole second of the newest bucket

    def _advance(self) -> int:
        """The index of the current second's bucket, clearing the buckets of the seconds passed."""
        now = int(self._clock())
        passed = now - self._stamp
        if passed > 0:
            for step in range(1, min(passed, self._seconds) + 1):
                i = (self._stamp + step) % self._seconds
                self._requests[i] = self._retries[i] = 0
            self._stamp = now
        return now % self._seconds

    def request(self) -> None:
        """A request arrived (its first attempt)."""
        self._requests[self._advance()] += 1

    def spend(self) -> bool:
        """May a retry go now? Counts it when it may."""
        i = self._advance()
        if sum(self._retries) < self.min_retries + self.share * sum(self._requests):
            self._retries[i] += 1
            return True
        return False
