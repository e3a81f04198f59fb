"""gateway.suspects: requests that backends failed under, counted, expiring, in bounded memory."""

import pytest

from gateway.suspects import Suspects
from tests.support import Clock


def test_a_request_is_refused_after_the_second_failure_under_it_until_it_expires():
    clock = Clock()
    s = Suspects(after=2, for_s=600.0, clock=clock)
    assert not s and s.refused_for(7) == 0.0
    assert s.failed_under(7, "a") == 1 and s.refused_for(7) == 0.0  # one failure may be the server's own
    assert s.failed_under(7, "a") == 1 and s.refused_for(7) == 0.0  # many copies of a body on one server
    assert s.failed_under(7, "b") == 2 and s.refused_for(7) == pytest.approx(600.0)
    assert s.refused_for(8) == 0.0  # another request is not suspect
    clock.now += 599.0
    assert s.refused_for(7) == pytest.approx(1.0)
    clock.now += 2.0
    assert s.refused_for(7) == 0.0 and len(s) == 0  # expired, and forgotten
    assert s.failed_under(7, "b") == 1  # counting starts again


def test_a_failure_long_after_the_first_does_not_add_to_it():
    clock = Clock()
    s = Suspects(after=2, for_s=60.0, clock=clock)
    s.failed_under(1, "a")
    clock.now += 61.0
    assert s.failed_under(1, "b") == 1 and s.refused_for(1) == 0.0


def test_after_zero_never_refuses():
    s = Suspects(after=0, clock=Clock())
    for name in "abcde":
        s.failed_under(3, name)
    assert s.refused_for(3) == 0.0


def test_memory_is_bounded_at_a_million_distinct_requests():
    s = Suspects(capacity=4096, clock=Clock())
    for h in range(1_000_000):
        s.failed_under(h, "a")
    assert len(s) == 4096
    assert s.failed_under(999_999, "b") == 2  # the newest are kept, the oldest forgotten
    assert s.failed_under(0, "b") == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Suspects(after=-1)
    with pytest.raises(ValueError):
        Suspects(capacity=0)
