"""The request-body deadline on its own: it cuts a read that outlives it, and only that."""

from __future__ import annotations

import asyncio
import time

from gateway.body_deadline import BodyDeadlines


def _read(deadlines: BodyDeadlines, body: asyncio.Future[bytes]) -> asyncio.Task[str]:
    async def read() -> str:
        task = deadlines.begin(0.05)
        try:
            await body
            return "read"
        except asyncio.CancelledError:
            if deadlines.expired(task):
                return "expired"
            raise
        finally:
            deadlines.end(task)

    return asyncio.ensure_future(read())


def test_a_read_past_its_deadline_is_cut_and_one_within_it_is_not():
    async def scenario() -> tuple[str, str, int]:
        loop = asyncio.get_running_loop()
        deadlines = BodyDeadlines()
        slow = _read(deadlines, loop.create_future())  # its body never comes
        quick_body = loop.create_future()
        quick = _read(deadlines, quick_body)
        quick_body.set_result(b"{}")
        return await slow, await quick, slow.cancelling()

    assert asyncio.run(scenario()) == ("expired", "read", 0)  # and the deadline's cancel undone


def test_another_cancellation_at_the_same_time_goes_on():
    """The server cancels the request's task as its deadline passes: the deadline's 408 must not
    swallow that cancellation."""

    async def scenario() -> bool:
        deadlines = BodyDeadlines()
        reader = _read(deadlines, asyncio.get_running_loop().create_future())
        await asyncio.sleep(0)
        deadlines.sweep(now=time.monotonic() + 1)  # its deadline passes ...
        reader.cancel()  # ... as the server cancels it too
        try:
            await reader
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(scenario())
