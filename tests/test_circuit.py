"""Circuit breaker state machine on a fake clock."""

from gateway.circuit import CircuitBreaker, CircuitState
from tests.support import Clock


def test_opens_after_consecutive_failures_only():
    cb = CircuitBreaker(failures=3, cooldown_s=5, clock=Clock())
    cb.record_failure()
    cb.record_failure()
    cb.record_success()
    cb.record_failure()
    cb.record_failure()
    assert cb.state is CircuitState.CLOSED and cb.allows()
    cb.record_failure()
    assert cb.state is CircuitState.OPEN and not cb.allows()


def test_half_open_lets_one_probe_through_then_closes_or_reopens():
    clock = Clock()
    cb = CircuitBreaker(failures=1, cooldown_s=5, clock=clock)
    cb.record_failure()
    clock.now = 4.9
    assert not cb.allows()
    clock.now = 5.0
    assert cb.state is CircuitState.HALF_OPEN and cb.allows()
    cb.on_dispatch()
    assert not cb.allows()  # one probe at a time
    cb.record_failure()
    assert cb.state is CircuitState.OPEN
    clock.now = 10.0
    assert cb.allows()
    cb.on_dispatch()
    cb.record_success()
    assert cb.state is CircuitState.CLOSED and cb.allows()


def test_readiness_closes_only_after_cooldown():
    clock = Clock()
    cb = CircuitBreaker(failures=1, cooldown_s=5, clock=clock)
    cb.record_failure()
    cb.record_ready()
    assert cb.state is CircuitState.OPEN
    clock.now = 6
    cb.record_ready()
    assert cb.state is CircuitState.CLOSED
