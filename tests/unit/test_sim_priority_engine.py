"""The twin's priority scheduling in its engine, without a server: the queue's order, eviction from
a full queue, preemption and retraction, and what is refused when priority is off (the same over
HTTP: tests/integration/test_sim_priority.py)."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest

from twin.engine import (
    PREEMPTED_MESSAGE,
    QUEUE_FULL_MESSAGE,
    Engine,
    QueueFull,
    RequestAborted,
    SimRequest,
)
from twin.options import PriorityOptions
from twin.profile import load_profile

QUEUED = [("a", None), ("b", 5), ("c", 1), ("d", 5), ("e", -3)]


def _engine(max_running: int = 1, max_queued: int | None = None, profile: str = "k26-ar", **prio: Any) -> Engine:
    opts = PriorityOptions(enable_priority_scheduling=True, **prio)
    return Engine(load_profile(profile), max_running=max_running, max_queued=max_queued, priority=opts)


def _req(e: Engine, rid: str) -> SimRequest:
    req = e.get(rid)
    assert req is not None, rid
    return req


def _finish_order(e: Engine) -> list[str]:
    order: list[str] = []
    for _ in range(100_000):
        if e.idle:
            return order
        order += [em.rid for em in e.step().emissions if em.finished]
    raise AssertionError("the engine never went idle")


@pytest.mark.parametrize(
    "opts,holder,expected",
    [
        ({}, 100, ["hold", "b", "d", "c", "e", "a"]),  # higher first, FCFS within 5, None last
        ({"schedule_low_priority_values_first": True}, -100, ["hold", "e", "c", "b", "d", "a"]),
    ],
)
def test_the_queue_admits_by_priority_then_first_come(opts: dict[str, Any], holder: int, expected: list[str]) -> None:
    e = _engine(**opts)
    e.submit("hold", 10, 4, priority=holder)
    e.step()  # hold runs: the others queue behind the one slot
    for rid, priority in QUEUED:
        e.submit(rid, 10, 4, priority=priority)
    assert [r.rid for r in e._waiting] == expected[1:]
    assert _req(e, "a").priority == (-sys.maxsize - 1 if not opts else sys.maxsize)  # least preferred
    assert _finish_order(e) == expected


def test_without_priority_scheduling_the_queue_is_a_plain_fcfs_deque() -> None:
    e = Engine(load_profile("k26-ar"), max_running=1)
    assert type(e._waiting).__name__ == "deque"
    e.submit("hold", 10, 4, priority=100)
    e.step()
    for rid, priority in QUEUED:
        e.submit(rid, 10, 4, priority=priority)
    assert _finish_order(e) == ["hold", "a", "b", "c", "d", "e"]


def test_a_priority_is_refused_only_with_abort_on_priority_when_disabled() -> None:
    strict = Engine(load_profile("k26-ar"), priority=PriorityOptions(abort_on_priority_when_disabled=True))
    with pytest.raises(RequestAborted, match="Using priority is disabled for this server"):
        strict.submit("p", 10, 4, priority=0)
    assert strict.num_waiting == 0 and strict.get("p") is None
    strict.submit("none", 10, 4)  # no priority: admitted
    Engine(load_profile("k26-ar")).submit("p", 10, 4, priority=0)  # the flag off: ignored
    ranked = _engine(abort_on_priority_when_disabled=True)  # scheduling on: the flag has no say
    ranked.submit("p", 10, 4, priority=0)


@pytest.mark.parametrize("low_first", [False, True])
def test_a_full_queue_evicts_its_newest_least_preferred_for_a_strictly_better_arrival(low_first: bool) -> None:
    sign = 1 if low_first else -1  # `priority * sign` ascending is the admission order
    e = _engine(max_queued=3, schedule_low_priority_values_first=low_first)
    e.submit("hold", 10, 4, priority=100 * -sign)
    e.step()
    for rid, better_by in (("w0", 0), ("w1", 1), ("w2", 0)):  # w2: the newest of the worst
        e.submit(rid, 10, 4, priority=better_by * -sign)
    for rid, better_by in (("tie", 0), ("worse", -1)):
        with pytest.raises(QueueFull, match=re.escape(QUEUE_FULL_MESSAGE)):
            e.submit(rid, 10, 4, priority=better_by * -sign)
    assert e.take_aborted() == []
    e.submit("better", 10, 4, priority=2 * -sign)
    (evicted,) = e.take_aborted()
    assert evicted.rid == "w2" and evicted.state == "aborted" and evicted.abort_message == PREEMPTED_MESSAGE
    assert e.get("w2") is None and [r.rid for r in e._waiting] == ["better", "w1", "w0"]
    assert _finish_order(e) == ["hold", "better", "w1", "w0"]


def test_an_empty_full_queue_refuses_the_arrival() -> None:
    e = _engine(max_queued=0)
    with pytest.raises(QueueFull):
        e.submit("x", 10, 4, priority=5)


def test_a_better_request_by_more_than_the_threshold_retracts_a_running_one() -> None:
    e = _engine()
    low = e.submit("low", 200, 50, priority=0)
    for _ in range(5):
        e.step()
    done = low.completion_tokens
    cached = low.cached_tokens
    e.submit("equal", 10, 5, priority=10)  # better by 10: not above the threshold
    e.step()
    assert low.state == "running" and e.num_waiting == 1
    e.submit("high", 10, 5, priority=11)
    res = e.step()
    assert low.state == "waiting" and _req(e, "high").state == "running"
    assert res.batch_size == 0 and "low" not in {em.rid for em in res.emissions}  # retracted before decoding
    assert [r.rid for r in e._waiting] == ["equal", "low"]
    assert low.completion_tokens == done + 1  # its output stays
    assert _finish_order(e) == ["high", "equal", "low"]
    assert low.completion_tokens == 50 and low.finish_reason == "length"
    assert low.cached_tokens == cached  # counted once (`retracted_stain`)
    st = e.stats()
    assert st.num_used_tokens == 0 and e._outside_cache == 0
    # the retracted request prefilled its prompt and its output again
    assert st.total_prompt_tokens == 200 + 10 + 10 + (200 + done + 1 - low.cached_tokens)


def test_the_retracted_are_the_least_preferred_and_newest_first() -> None:
    e = _engine(max_running=3, priority_scheduling_preemption_threshold=0)
    for rid, priority in (("p1", 1), ("p0a", 0), ("p0b", 0)):
        e.submit(rid, 10, 1000, priority=priority)
    e.step()
    e.submit("high", 10, 5, priority=5)
    e.step()
    assert [r.rid for r in e._running] == ["p1", "p0a", "high"]  # p0b: lowest, newest
    assert _req(e, "p0b").state == "waiting"


def test_no_preemption_with_disable_priority_preemption() -> None:
    e = _engine(disable_priority_preemption=True)
    low = e.submit("low", 10, 20, priority=0)
    e.step()
    e.submit("high", 10, 5, priority=1000)
    e.step()
    assert low.state == "running"
    assert _finish_order(e) == ["low", "high"]


def test_preemption_frees_enough_memory_and_a_retracted_request_can_meet_a_full_queue() -> None:
    # two running requests must both leave for the big one; the queue holds one: the second
    # retracted finds it full of an equal priority and is aborted (`_add_request_to_queue`)
    e = _engine(max_running=2, max_queued=1)
    total = e.profile.max_total_num_tokens
    e.submit("l1", 60_000, 10, priority=0)
    e.step()  # l1 leaves the queue (a chunked prefill)
    e.submit("l2", 60_000, 10, priority=0)
    while _req(e, "l2").state != "running":
        e.step()
    big = e.submit("big", total - 10_010, 10, priority=50)
    e.step()
    assert big.state in ("prefilling", "running") and e.num_running == 1
    (aborted,) = e.take_aborted()
    # l2 (the newest) was retracted first and went back; l1 found the queue full
    assert aborted.rid == "l1" and aborted.abort_message == QUEUE_FULL_MESSAGE and aborted.state == "aborted"
    assert [r.rid for r in e._waiting] == ["l2"]
    assert _finish_order(e) == ["big", "l2"]
    assert e.stats().num_used_tokens == 0


def test_retraction_on_a_speculative_profile_keeps_every_count_consistent() -> None:
    e = _engine(profile="k26-dflash", max_running=2)
    a = e.submit("a", 300, 400, "Solve 3x + 5 = 11", priority=0)
    b = e.submit("b", 300, 400, "Write a sorting function", priority=0)
    for _ in range(10):
        e.step()
    e.submit("c", 50, 30, priority=20)
    e.step()
    assert b.state == "waiting" and a.state == "running"  # b, the newer, leaves
    _finish_order(e)
    assert a.completion_tokens == b.completion_tokens == 400
    assert e.stats().num_used_tokens == 0
