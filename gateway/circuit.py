"""Per-backend circuit breaker fed by live traffic: closed -> open -> half-open -> closed.

Readiness checks (the poller) say whether a server is up; the breaker says whether requests to it
are succeeding. After `failures` consecutive failed requests the circuit opens and the backend gets
no traffic for `cooldown_s`; then one probe request is let through (half-open): success closes the
circuit, failure opens it again. A successful readiness check after the cooldown also closes it,
so an idle backend is not stuck open for want of a probe request.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class CircuitState(str, enum.Enum):  # noqa: UP042  (StrEnum would change str() and f-strings of members)
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    __slots__ = ("failures", "cooldown_s", "_clock", "_state", "_consecutive", "_opened_at", "_probe_out")

    def __init__(self, failures: int = 3, cooldown_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probe_out = False

    @property
    def state(self) -> CircuitState:
        if self._state is CircuitState.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._state = CircuitState.HALF_OPEN
            self._probe_out = False
        return self._state

    def allows(self) -> bool:
        """May a request be sent now? In half-open, only while no probe is outstanding."""
        state = self.state
        return state is CircuitState.CLOSED or (state is CircuitState.HALF_OPEN and not self._probe_out)

    def on_dispatch(self) -> None:
        if self._state is CircuitState.HALF_OPEN:
            self._probe_out = True

    def record_success(self) -> None:
        self._consecutive = 0
        self._state = CircuitState.CLOSED
        self._probe_out = False

    def record_failure(self) -> None:
        self._consecutive += 1
        if self._state is CircuitState.HALF_OPEN or self._consecutive >= self.failures:
            self._state = CircuitState.OPEN
            self._opened_at = self._clock()
            self._probe_out = False

    def record_ready(self) -> None:
        """A good readiness check: only ends an open circuit once its cooldown is over."""
        if self.state is CircuitState.HALF_OPEN:
            self.record_success()
