"""Limits on client connections, kept where a connection lives: uvicorn's protocol, per socket.

- **How many.** At most `max_connections` open at once; one more is answered 503 (OpenAI's
  error shape) and closed. Each holds a file descriptor and buffers; without a cap a flood of
  idle connections exhausts the process's descriptors and every client fails.
- **Headers in time.** A connection must send a request's headers within `header_timeout_s` of
  connecting, or of that request's first byte on a kept-alive connection (slow-loris); else 408
  and closed. uvicorn bounds the idle time between requests (`timeout_keep_alive`) but not this.
- **A client that stops reading.** When the client takes no bytes, the kernel's buffers fill, then
  the transport's, and asyncio tells the protocol (`pause_writing`). Paused for `send_timeout_s`
  without resuming, the connection is aborted (nginx's `send_timeout`). uvicorn then reports the
  disconnect to the app, whose watch (gateway.downstream) cancels the request: the upstream
  connection closes, SGLang aborts the generation, and the backend slot is free again.

Only public interfaces: uvicorn's `http=` protocol class and asyncio's protocol callbacks and
transport.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import ApiError

if TYPE_CHECKING:
    from gateway.refusals import Refusals

__all__ = ["ConnectionLimits", "LimitedProtocol"]

log = logging.getLogger("specroute.connections")


class ConnectionLimits:
    """The limits, shared by every connection of a server (a reload may change them), and the
    connections open. Their header deadlines are kept by one sweep every `SWEEP_S` over the
    connections waiting for headers, not by a timer per request (a timer armed and cancelled for
    every request of a kept-alive connection costs more than the request's own parse)."""

    __slots__ = (
        "max_connections",
        "header_timeout_s",
        "send_timeout_s",
        "connections",
        "refused",
        "dropped",
        "refusals",
        "_sweep",
    )

    SWEEP_S = 1.0

    def __init__(self, max_connections: int, header_timeout_s: float, send_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.send_timeout_s = send_timeout_s
        self.connections: set[LimitedProtocol] = set()
        self.refused = 0  # connections turned away at the cap
        self.dropped = 0  # connections closed for their headers' or their reading's time
        self.refusals: Refusals | None = None  # where the 503s and 408s sent here are counted and logged
        self._sweep: asyncio.TimerHandle | None = None

    @property
    def open(self) -> int:
        return len(self.connections)

    def add(self, connection: LimitedProtocol) -> None:
        self.connections.add(connection)
        if self._sweep is None:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(min(self.SWEEP_S, self.header_timeout_s / 2), self._run)

    def _run(self) -> None:
        now = asyncio.get_running_loop().time()
        late = [
            c
            for c in self.connections
            if c.headers_since is not None and now - c.headers_since >= self.header_timeout_s
        ]
        for connection in late:
            connection.headers_late()
        self._sweep = (
            asyncio.get_running_loop().call_later(min(self.SWEEP_S, self.header_timeout_s / 2), self._run)
            if self.connections
            else None
        )


def _raw_error(status: int, reason: bytes, error: ApiError) -> bytes:
    body = error.body()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, reason, len(body))
        + body
    )


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above. uvicorn takes a class (`http=`), so a
    server's limits come as a class attribute: `LimitedProtocol.limited_by(limits)`."""

    gateway_limits: ConnectionLimits

    @classmethod
    def limited_by(cls, limits: ConnectionLimits) -> type[LimitedProtocol]:
        return type(cls.__name__, (cls,), {"gateway_limits": limits})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # When the headers now awaited began to be awaited (loop time); None while none are.
        self.headers_since: float | None = None
        self.send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast(asyncio.Transport, transport))  # uvicorn serves TCP: a Transport
        limits = self.gateway_limits
        if limits.open >= limits.max_connections:
            limits.refused += 1
            if limits.refusals is not None:
                limits.refusals.refused("connection_limit", 503, client=self.client)
            error = ApiError(
                503, f"the gateway has {limits.max_connections} connections open (gateway.max_connections)"
            )
            self.transport.write(_raw_error(503, b"Service Unavailable", error))
            self.transport.close()
            return
        self.headers_since = self.loop.time()
        limits.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gateway_limits.connections.discard(self)
        self.headers_since = None
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        super().connection_lost(exc)

    # -- headers in time

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.headers_since is None:
            self.headers_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self.headers_since = None
        super().on_headers_complete()

    def headers_late(self) -> None:
        """The sweep found this connection's headers late: 408, and closed."""
        self.headers_since = None
        if self.transport.is_closing():
            return
        self.gateway_limits.dropped += 1
        if self.gateway_limits.refusals is not None:
            self.gateway_limits.refusals.refused("header_timeout", 408, client=self.client)
        timeout = self.gateway_limits.header_timeout_s
        error = ApiError(408, f"request headers not received within {timeout:g}s (timeouts.client_header_s)")
        self.transport.write(_raw_error(408, b"Request Timeout", error))
        self.transport.close()

    # -- a client that stops reading

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = asyncio.get_running_loop().call_later(
                self.gateway_limits.send_timeout_s, self._stalled_reader
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _stalled_reader(self) -> None:
        self.send_timer = None
        self.gateway_limits.dropped += 1
        client = self.client
        log.warning(
            "client %s took no bytes for %gs (timeouts.client_send_s): connection dropped, its request ended",
            f"{client[0]}:{client[1]}" if client else "unknown",
            self.gateway_limits.send_timeout_s,
        )
        self.transport.abort()
