"""Per-backend circuit breaker fed by live traffic: closed -> open -> half-open -> closed.

Readiness checks (the poller) say whether a server is up; the breaker says whether requests to it
are succeeding. Only failures that say something about the backend count (gateway.attempt: no
connection, no answer in time, 502/503/504 from it, a stalled engine), never a request's own error.
After `failures` consecutive ones the circuit opens and the backend gets no traffic for its
cooldown; then one probe request is let through (half-open): success closes the circuit, failure
opens it again with twice the cooldown (up to `max_cooldown_s`), so a backend that keeps failing
costs fewer and fewer requests. A readiness check does not close a circuit: a server that answers
`/ready` may still fail every request, and only a request can tell.

A circuit opens only while `may_open()` allows: the pool lets at most a share of a model's backends
be ejected at once (gateway.pool), as Envoy's outlier detection does, so that requests failing
everywhere (a bad client, a poisoned prompt) cannot empty the pool.
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
    __slots__ = (
        "failures",
        "cooldown_s",
        "max_cooldown_s",
        "may_open",
        "_clock",
        "_state",
        "_consecutive",
        "_opens",
        "_opened_at",
        "_probe_out",
    )

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_cooldown_s: float = 300.0,
        may_open: Callable[[], bool] | None = None,
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.may_open = may_open
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._consecutive = 0
        self._opens = 0  # times opened since the last success
        self._opened_at = 0.0
        self._probe_out = False

    @property
    def current_cooldown_s(self) -> float:
        """How long the circuit stays open this time: doubled with each reopening."""
        if self._opens <= 1:
            return self.cooldown_s
        doubled: float = self.cooldown_s * 2.0 ** (self._opens - 1)
        return min(doubled, max(self.max_cooldown_s, self.cooldown_s))

    @property
    def state(self) -> CircuitState:
        if self._state is CircuitState.OPEN and self._clock() - self._opened_at >= self.current_cooldown_s:
            self._state = CircuitState.HALF_OPEN
            self._probe_out = False
        return self._state

    @property
    def ejected(self) -> bool:
        """Open or half-open: out of the pool but for its probe."""
        return self.state is not CircuitState.CLOSED

    def allows(self) -> bool:
        """May a request be sent now? In half-open, only while no probe is outstanding."""
        state = self.state
        return state is CircuitState.CLOSED or (state is CircuitState.HALF_OPEN and not self._probe_out)

    def on_dispatch(self) -> bool:
        """A request goes to the backend; True when it is the half-open circuit's probe."""
        if self.state is CircuitState.HALF_OPEN and not self._probe_out:
            self._probe_out = True
            return True
        return False

    def probe_ended(self) -> None:
        """The probe ended without a verdict on the backend (its client left, the backend was
        busy): the next request probes instead."""
        if self._state is CircuitState.HALF_OPEN:
            self._probe_out = False

    def record_success(self) -> None:
        self._consecutive = 0
        self._opens = 0
        self._state = CircuitState.CLOSED
        self._probe_out = False

    def record_failure(self) -> None:
        self._consecutive += 1
        half_open = self.state is CircuitState.HALF_OPEN
        if half_open or (self._state is CircuitState.CLOSED and self._consecutive >= self.failures):
            if not half_open and self.may_open is not None and not self.may_open():
                return  # the pool's share of ejected backends is used up: it stays in
            self._state = CircuitState.OPEN
            self._opens += 1
            self._opened_at = self._clock()
            self._probe_out = False
