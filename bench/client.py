"""A cheap HTTP/1.1 load client for the benchmark: raw asyncio protocol + httptools' parser.

One keep-alive connection per simulated client, requests precomputed as bytes, timings taken with
`perf_counter` in the protocol callbacks. It costs a few microseconds per request and per chunk,
so what it measures is the servers', not its own, cost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httptools

_CONTENT = b'"content":" '  # a content delta with text (role chunks carry "content":"")
_KEEP = len(_CONTENT) - 1


def request_bytes(path: str, body: bytes, host: str, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


class Connection(asyncio.Protocol):
    """Sends one request at a time; `request()` resolves to (status, t_first_content, t_end, chunks)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.t_first = 0.0
        self.chunks = 0
        self.status = 0
        self.reads = 0  # socket reads (data_received calls) for the current response
        self.tail = b""  # the current body's last bytes, shorter than a delta marker
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport is an asyncio.Transport; the Protocol signature says BaseTransport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        seen = self.tail + body  # a delta marker can straddle two body callbacks
        n = seen.count(_CONTENT)
        self.tail = seen[-_KEEP:]
        if n:
            if not self.chunks:
                self.t_first = time.perf_counter()
            self.chunks += n

    def on_message_complete(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result((self.status, self.t_first, time.perf_counter(), self.chunks))

    def request(self, raw: bytes) -> asyncio.Future:
        self.t_first = 0.0
        self.chunks = 0
        self.status = 0
        self.reads = 0
        self.tail = b""
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)  # type: ignore[union-attr]  # connected: set by connection_made
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(host: str, port: int) -> Connection:
    _, proto = await asyncio.get_running_loop().create_connection(Connection, host, port)
    return proto


class LevelResult:
    """Raw samples of one closed-loop level."""

    __slots__ = ("latencies", "ttfts", "chunks", "errors", "wall", "reads")

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.chunks = 0
        self.errors = 0
        self.wall = 0.0
        self.reads = 0  # socket reads the answers took (the raw client counts them; 0 otherwise)

    @property
    def count(self) -> int:
        return len(self.latencies)


async def closed_loop(
    host: str, port: int, raw: bytes, concurrency: int, *, requests: int | None = None, duration: float | None = None
) -> LevelResult:
    """`concurrency` clients each sending `raw` back to back, until `requests` are done or `duration` passes."""
    conns = [await connect(host, port) for _ in range(concurrency)]
    res = LevelResult()
    budget = [requests if requests is not None else 1 << 62]
    t0 = time.perf_counter()
    deadline = t0 + duration if duration is not None else float("inf")
    lat, ttft = res.latencies, res.ttfts
    clock = time.perf_counter

    async def worker(conn: Connection) -> None:
        while budget[0] > 0:
            budget[0] -= 1
            t = clock()
            if t >= deadline:
                return
            try:
                status, t_first, t_end, chunks = await conn.request(raw)
            except ConnectionError:
                res.errors += 1
                return
            if status != 200:
                res.errors += 1
                continue
            lat.append(t_end - t)
            if t_first:
                ttft.append(t_first - t)
            res.chunks += chunks
            res.reads += conn.reads

    await asyncio.gather(*(worker(c) for c in conns))
    res.wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return res


async def paced(host: str, port: int, raw: bytes, rate: float, duration: float, *, connections: int = 8) -> LevelResult:
    """`rate` requests/s for `duration` s, spread over `connections` keep-alive connections: each
    sends on its own schedule (every connections/rate s, staggered), or at once when its previous
    answer came late. Latency counts from the actual send."""
    conns = [await connect(host, port) for _ in range(connections)]
    res = LevelResult()
    interval = connections / rate
    t0 = time.perf_counter() + 0.01
    end = t0 + duration
    clock = time.perf_counter

    async def worker(k: int, conn: Connection) -> None:
        due = t0 + k / rate
        while due < end:
            wait = due - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            t = clock()
            try:
                status, t_first, t_end, chunks = await conn.request(raw)
            except ConnectionError:
                res.errors += 1
                return
            if status != 200:
                res.errors += 1
            else:
                res.latencies.append(t_end - t)
                if t_first:
                    res.ttfts.append(t_first - t)
                res.chunks += chunks
            due += interval

    await asyncio.gather(*(worker(k, c) for k, c in enumerate(conns)))
    res.wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return res
