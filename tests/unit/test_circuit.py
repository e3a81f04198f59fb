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


def test_half_open_lets_one_probe_through_then_closes_or_reopens_for_longer():
    clock = Clock()
    cb = CircuitBreaker(failures=1, cooldown_s=5, clock=clock)
    cb.record_failure()
    clock.now = 4.9
    assert not cb.allows()
    clock.now = 5.0
    assert cb.state is CircuitState.HALF_OPEN and cb.allows()
    assert cb.on_dispatch()  # the probe
    assert not cb.allows() and not cb.on_dispatch()  # one probe at a time
    cb.record_failure()
    assert cb.state is CircuitState.OPEN
    clock.now = 14.9  # reopened at 5 for twice the cooldown
    assert not cb.allows()
    clock.now = 15.0
    assert cb.allows()
    cb.on_dispatch()
    cb.record_success()
    assert cb.state is CircuitState.CLOSED and cb.allows()
    cb.record_failure()  # after a success the cooldown is the first one again
    clock.now = 20.0
    assert cb.allows()


def test_the_cooldown_doubles_up_to_its_maximum():
    clock = Clock()
    cb = CircuitBreaker(failures=1, cooldown_s=5, clock=clock, max_cooldown_s=12)
    cooldowns = []
    for _ in range(4):
        cb.record_failure()  # opens (or reopens from half-open)
        opened = clock.now
        while not cb.allows():
            clock.now += 0.5
        cooldowns.append(clock.now - opened)
        cb.on_dispatch()
    assert cooldowns == [5.0, 10.0, 12.0, 12.0]


def test_a_probe_that_ends_without_a_verdict_lets_the_next_request_probe():
    clock = Clock()
    cb = CircuitBreaker(failures=1, cooldown_s=5, clock=clock)
    cb.record_failure()
    clock.now = 5
    assert cb.on_dispatch() and not cb.allows()
    cb.probe_ended()  # its client left, or the backend was busy
    assert cb.state is CircuitState.HALF_OPEN and cb.allows()


def test_a_readiness_check_does_not_close_an_open_circuit():
    """Only a request can tell that requests succeed again: the breaker has no readiness input."""
    clock = Clock()
    cb = CircuitBreaker(failures=1, cooldown_s=5, clock=clock)
    cb.record_failure()
    assert not hasattr(cb, "record_ready")
    clock.now = 6
    assert cb.state is CircuitState.HALF_OPEN  # a probe, not a reset


def test_a_circuit_opens_only_while_the_pool_allows_an_ejection():
    allowed = [False]
    cb = CircuitBreaker(failures=2, cooldown_s=5, clock=Clock(), may_open=lambda: allowed[0])
    for _ in range(5):
        cb.record_failure()
    assert cb.state is CircuitState.CLOSED and cb.allows()  # the share of ejected backends is used up
    allowed[0] = True
    cb.record_failure()
    assert cb.state is CircuitState.OPEN
