"""The admission queue on its own: what happens to a waiter at the edges of its wait."""

from __future__ import annotations

import asyncio

import pytest

from backends import BackendSpec, Strategy
from backends.client import SGLangClient
from gateway.admission import Admission
from gateway.errors import ApiError
from gateway.pool import Backend, Pools


def _admission(max_queue: int = 4) -> tuple[Admission, Backend]:
    spec = BackendSpec(name="a", url="http://127.0.0.1:9", model="kimi-k2.6", strategy=Strategy.AR)
    backend = Backend(spec, SGLangClient(spec))
    pools = Pools([backend])
    return Admission(pools, max_inflight=1, max_queue=max_queue, queue_timeout_s=60), backend


def test_a_waiter_cancelled_as_its_slot_comes_free_leaves_and_passes_the_slot_on():
    """The client leaves in the same loop turn as a slot frees for it: the wait must end in
    CancelledError (the request is not dispatched for nobody) and the slot go to the next waiter."""

    async def scenario() -> tuple[list[Backend], int, int]:
        admission, backend = _admission()
        held = admission.lease(backend)
        leaving = asyncio.create_task(admission.candidates("kimi-k2.6"))
        staying = asyncio.create_task(admission.candidates("kimi-k2.6"))
        await asyncio.sleep(0)  # one step each: both reach the queue
        assert admission.waiting == 2
        held.release()  # resolves the first waiter's future ...
        leaving.cancel()  # ... as its client goes
        with pytest.raises(asyncio.CancelledError):
            await leaving
        chosen = await asyncio.wait_for(staying, 5)
        return chosen, admission.waiting, admission.inflight

    chosen, waiting, inflight = asyncio.run(scenario())
    assert [b.name for b in chosen] == ["a"] and waiting == 0 and inflight == 0


def test_waiters_that_time_out_or_leave_are_taken_out_of_the_queue():
    """No slot frees while waiters come and go: the FIFO must not keep what left it, or it would
    grow with every request that gave up."""

    async def scenario() -> tuple[int, int, int, int]:
        admission, backend = _admission(max_queue=100)
        admission.queue_timeout_s = 0.05
        held = admission.lease(backend)
        timed_out = [asyncio.create_task(admission.candidates("kimi-k2.6")) for _ in range(50)]
        results = await asyncio.gather(*timed_out, return_exceptions=True)
        admission.queue_timeout_s = 60
        leaving = [asyncio.create_task(admission.candidates("kimi-k2.6")) for _ in range(50)]
        await asyncio.sleep(0)  # one step each: all in the queue
        assert admission.waiting == 50
        for task in leaving:
            task.cancel()
        await asyncio.gather(*leaving, return_exceptions=True)
        after = admission.queued("kimi-k2.6"), admission.waiting
        held.release()
        refused = sum(isinstance(r, ApiError) and r.status == 429 for r in results)
        return refused, *after, admission.inflight

    refused, queued, waiting, inflight = asyncio.run(scenario())
    assert refused == 50 and queued == 0 and waiting == 0 and inflight == 0


def _two_backends() -> tuple[Admission, Backend, Backend]:
    specs = [BackendSpec(name=n, url="http://127.0.0.1:9", model="kimi-k2.6", strategy=Strategy.AR) for n in ("a", "b")]
    a, b = (Backend(spec, SGLangClient(spec), cap=1) for spec in specs)
    a.adapters = frozenset({"style"})
    return Admission(Pools([a, b]), max_inflight=100, max_queue=10, queue_timeout_s=60), a, b


@pytest.mark.parametrize("needs", ["pin", "adapter"])
def test_a_slot_goes_to_the_first_waiter_that_can_use_it(needs):
    """The head of the queue can take only backend a (pinned there, or needing an adapter only a
    has loaded). A slot freed on b must go to the next waiter, not be spent waking the head, or
    that waiter would sit out its timeout beside an idle backend."""

    async def scenario() -> tuple[list[str], bool, list[str]]:
        admission, a, b = _two_backends()
        held_a, held_b = admission.lease(a), admission.lease(b)
        kwargs = {"pin": "a"} if needs == "pin" else {"adapters": frozenset({"style"})}
        head = asyncio.create_task(admission.candidates("kimi-k2.6", **kwargs))
        await asyncio.sleep(0)
        behind = asyncio.create_task(admission.candidates("kimi-k2.6"))
        await asyncio.sleep(0)
        held_b.release()
        got = await asyncio.wait_for(behind, 5)
        head_waiting = not head.done()
        held_a.release()
        head_got = await asyncio.wait_for(head, 5)
        return [x.name for x in got], head_waiting, [x.name for x in head_got]

    behind_got, head_waiting, head_got = asyncio.run(scenario())
    assert behind_got == ["b"] and head_waiting and head_got == ["a"]


def test_no_backend_with_the_adapter_up_is_a_503_naming_it():
    async def scenario() -> ApiError:
        admission, a, _b = _two_backends()
        a.ready = False
        with pytest.raises(ApiError) as e:
            await admission.candidates("kimi-k2.6", adapters=frozenset({"style"}))
        return e.value

    error = asyncio.run(scenario())
    assert error.status == 503 and "style" in error.message


async def _served_order(admission: Admission, backend: Backend, priorities: list[int | None]) -> list[int]:
    """Queue one request per priority behind a held slot, in this order, then let the slot pass
    from each to the next: the order they were served in, as indices into `priorities`."""
    held = admission.lease(backend)
    served: list[int] = []

    async def request(index: int, priority: int | None) -> None:
        await admission.candidates("kimi-k2.6", priority=priority)
        served.append(index)
        admission.lease(backend).release()  # done at once: the slot wakes the next waiter

    tasks = []
    for index, priority in enumerate(priorities):
        tasks.append(asyncio.create_task(request(index, priority)))
        await asyncio.sleep(0)  # queued in this order
    assert admission.waiting == len(priorities)
    held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    return served


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        # SGLang's default direction: a higher value first; a request without one is the default, 0
        ("high_first", [1, 3, 2, 0, 5, 4]),
        # --schedule-low-priority-values-first
        ("low_first", [4, 0, 5, 2, 1, 3]),
        ("fifo", [0, 1, 2, 3, 4, 5]),
    ],
)
def test_waiters_are_served_by_priority_first_come_first_served_within_one(order, expected):
    async def scenario() -> list[int]:
        admission, backend = _admission(max_queue=10)
        admission.priority_order = order
        return await _served_order(admission, backend, [None, 5, 1, 5, -3, None])

    assert asyncio.run(scenario()) == expected


def test_the_default_priority_places_a_request_that_names_none():
    async def scenario() -> list[int]:
        admission, backend = _admission(max_queue=10)
        admission.default_priority = 3
        return await _served_order(admission, backend, [1, None, 5])

    assert asyncio.run(scenario()) == [2, 1, 0]


def test_a_full_queue_turns_away_its_newest_lowest_waiter_for_a_better_request_only():
    """As SGLang's `_abort_on_queued_limit`: a strictly better arrival takes the place of the newest
    of the lowest priority; an equal or worse one is refused itself."""

    async def scenario() -> tuple[list[object], list[str], int]:
        admission, backend = _admission(max_queue=3)
        held = admission.lease(backend)
        waiters = []
        for priority in (0, 1, 0):  # the third is the newest of the lowest
            waiters.append(asyncio.create_task(admission.candidates("kimi-k2.6", priority=priority)))
            await asyncio.sleep(0)
        refused = []
        for priority in (0, -1):  # not better than the worst: refused themselves
            with pytest.raises(ApiError) as e:
                await admission.candidates("kimi-k2.6", priority=priority)
            refused.append(e.value.message)
        better = asyncio.create_task(admission.candidates("kimi-k2.6", priority=2))
        await asyncio.sleep(0)
        outcome_third: list[object] = list(await asyncio.gather(waiters[2], return_exceptions=True))
        queued = admission.waiting
        held.release()
        for task in (better, waiters[1], waiters[0]):  # served in rank order, one at a time
            await asyncio.wait_for(task, 5)
            admission.lease(backend).release()
        return outcome_third, refused, queued

    outcome_third, refused, queued = asyncio.run(scenario())
    (third,) = outcome_third
    assert isinstance(third, ApiError) and third.status == 429 and "higher priority" in third.message
    assert all("queue is full" in m and "higher priority" not in m for m in refused)
    assert queued == 3


def test_a_bad_priority_is_a_400_naming_it():
    from gateway.openai_request import parse

    for raw in (b'"high"', b"[1]", b"1.5", str(1 << 63).encode(), str(-(1 << 63) - 1).encode()):
        body = b'{"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], "priority": ' + raw + b"}"
        with pytest.raises(ApiError) as e:
            parse(body, "chat")
        assert e.value.status == 400 and e.value.param == "priority"
    ok = parse(b'{"model": "m", "prompt": "hi", "priority": -7}', "completion")
    assert ok.priority == -7 and ok.body.get("priority") == -7  # and it goes upstream untouched
    # read as SGLang's pydantic model reads it (lax mode): true and "5" are integers there
    lax = parse(b'{"model": "m", "prompt": "hi", "priority": true}', "completion")
    assert lax.priority == 1 and lax.body.get("priority") is True
    assert parse(b'{"model": "m", "prompt": "hi", "priority": "5"}', "completion").priority == 5


def test_a_request_of_n_sequences_waits_until_its_backend_has_room_for_all_of_them():
    """The per-backend cap counts sequences: a request with n = 4 on a backend holding 3 of its 4
    waits (a smaller one still goes in beside them) until the backend has room for 4, or is idle,
    where a request of any size runs (otherwise one larger than the cap never could)."""

    async def scenario() -> list[object]:
        spec = BackendSpec(name="a", url="http://127.0.0.1:9", model="kimi-k2.6", strategy=Strategy.AR)
        a = Backend(spec, SGLangClient(spec), cap=4)
        admission = Admission(Pools([a]), max_inflight=100, max_queue=10, queue_timeout_s=60)
        seen: list[object] = []
        three = admission.lease(a, 3)
        big = asyncio.create_task(admission.candidates("kimi-k2.6", sequences=4))
        await asyncio.sleep(0)
        seen.append(("big waits", not big.done(), admission.waiting))
        small = await asyncio.wait_for(admission.candidates("kimi-k2.6", sequences=1), 5)
        one = admission.lease(small[0], 1)
        three.release()  # 1 of 4 held: no room for 4 yet
        await asyncio.sleep(0)
        seen.append(("still waits", not big.done(), a.view.inflight))
        one.release()  # idle
        seen.append(("runs", [b.name for b in await asyncio.wait_for(big, 5)]))
        huge = await asyncio.wait_for(admission.candidates("kimi-k2.6", sequences=128), 5)
        seen.append(("idle takes any size", [b.name for b in huge]))
        return seen

    assert asyncio.run(scenario()) == [
        ("big waits", True, 1),
        ("still waits", True, 1),
        ("runs", ["a"]),
        ("idle takes any size", ["a"]),
    ]
