"""The stream deadline (gateway/stream_deadline.py): first_byte_s until the first token, then each
read on its own, and never the time spent sending to the client."""

from __future__ import annotations

import asyncio

import pytest

from gateway.stream_deadline import StreamDeadline


def _run(coro) -> None:
    asyncio.run(coro)


def test_no_first_token_within_first_byte_s_expires():
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with StreamDeadline(0.05, 10):
                await asyncio.sleep(30)  # would hang the test without the deadline

    _run(main())


def test_after_the_first_token_a_read_that_stalls_expires_after_idle_s_not_first_byte_s():
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with StreamDeadline(30, 0.05) as d:
                d.first_token()
                d.since = d.clock()
                await asyncio.sleep(20)

    _run(main())


def test_time_spent_sending_to_a_slow_client_does_not_count():
    async def main() -> None:
        async with StreamDeadline(30, 0.05) as d:
            d.first_token()
            for _ in range(3):
                d.since = d.clock()
                await asyncio.sleep(0)  # a read that answers at once
                d.since = None
                await asyncio.sleep(0.2)  # a send that blocks 4x idle_s

    _run(main())


def test_someone_elses_cancellation_passes_through():
    async def main() -> None:
        async def victim() -> None:
            async with StreamDeadline(30, 30):
                await asyncio.sleep(30)

        task = asyncio.ensure_future(victim())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(main())
