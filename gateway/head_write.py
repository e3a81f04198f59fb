"""A response's head and the first part of its body in one write.

uvicorn writes the status line and headers as soon as the app sends `http.response.start`, and the
body when it sends `http.response.body`: two `write()`s, two TCP segments for every non-streamed
answer. A raw client barely notices; an ordinary one (aiohttp, httpx) resolves the response on the
head and reads the body on a second wake-up, which costs it tens of microseconds per request
(`python -m bench.split_writes`; docs/performance.md). SGLang's Rust router sends head and body
in one `writev`; SGLang's own server runs on uvicorn and splits them as uvicorn does.

`HeadHoldingProtocol` is uvicorn's httptools protocol with its transport wrapped: a write that
starts a response (`HTTP/1.1 ...`) is held, and leaves with the next write (the body, or a stream's
first chunk) as one `write()`; if nothing follows in the same pass of the event loop (a stream whose
first chunk is not there yet), it leaves on its own at the end of that pass. Every other write goes
straight through, so a stream's chunks cost nothing more. Only public API: uvicorn's `http=`
protocol class and asyncio's `Transport`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD = b"HTTP/1."


class HeadHoldingTransport:
    """Forwards everything to `transport`, holding a response head until the write after it."""

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif type(data) is bytes and data.startswith(_HEAD):  # uvicorn writes a head as one bytes object
            self._head = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:  # asked per request: not through __getattr__
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # everything else: the real transport's
        return getattr(self._transport, name)


class HeadHoldingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (`uvicorn.Config(http=...)`) over a `HeadHoldingTransport`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvicorn serves TCP, whose transport is an asyncio.Transport (the Protocol signature says BaseTransport);
        # the wrapper is one by duck typing, not by class.
        wrapped: Any = HeadHoldingTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        super().connection_made(wrapped)
