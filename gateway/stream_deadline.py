"""The deadline of one upstream stream, as `async with StreamDeadline(first_byte_s, idle_s)`.

Until the stream's first generated token, the whole wait counts against `first_byte_s` (SGLang sends
no header before that token: this is its queue plus the prompt's prefill). After it, each read of the
upstream counts against `idle_s` on its own, and time spent sending to the client counts against
nothing: a slow client is not an upstream that stalled (aiohttp's socket-read timeout, which this
replaces, likewise stopped while reading was paused).

Cheap per chunk: the relay loop only stores when the current read began (`since`), and None while it
sends. A timer wakes at most once per `idle_s` to look; when a read has run too long it expires the
`asyncio.timeout` underneath, which cancels the block and raises TimeoutError at its exit, as
`asyncio.timeout` does (moving that timeout at every chunk cost a timer re-arm per chunk).
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class StreamDeadline:
    __slots__ = ("_first_byte_s", "_idle_s", "limit", "since", "clock", "_timeout", "_timer")

    def __init__(self, first_byte_s: float, idle_s: float) -> None:
        self._first_byte_s = first_byte_s
        self._idle_s = idle_s
        self.limit = first_byte_s
        # When the wait now under way began (loop time); None while the gateway sends to the client.
        self.since: float | None = None

    async def __aenter__(self) -> StreamDeadline:
        loop = asyncio.get_running_loop()
        self.clock = loop.time
        self._timeout = asyncio.timeout(None)
        await self._timeout.__aenter__()
        self.since = self.clock()
        self._timer = loop.call_at(self.since + self.limit, self._check)
        return self

    def first_token(self) -> None:
        """The first token is in: from now on each read has `idle_s` (the caller sends first)."""
        self.limit = self._idle_s
        self.since = None
        self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(self.clock() + self.limit, self._check)

    @property
    def scope(self) -> asyncio.Timeout:
        """The `asyncio.timeout` scope underneath: expiring it ends the block as the deadline would."""
        return self._timeout

    def _check(self) -> None:
        if self._timeout.expired():  # ended already (a backend that stopped stepping: gateway.attempt)
            return
        now = self.clock()
        since = self.since
        if since is not None and now - since >= self.limit:
            self._timeout.reschedule(now)  # expire: the block's task is cancelled at once
            return
        self._timer = asyncio.get_running_loop().call_at((now if since is None else since) + self.limit, self._check)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._timer.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError when it expired
