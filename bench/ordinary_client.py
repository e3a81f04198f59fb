"""The benchmark's second client: aiohttp, as users' own clients are (the `openai` SDK's httpx, or
aiohttp itself), next to the raw one in `bench.client`.

The raw client costs a few microseconds per request, so what it measures is the servers' cost. An
ordinary client costs far more (about 100 us of CPU per request in aiohttp's Python code), and how
a server's answer is shaped (headers, chunking, how its bytes arrive) changes how much of that the
client spends and when; a figure only the raw client sees may not be the one a user sees. Both
clients run the same scenarios against the same targets, and `bench.gateway_bench` reports both.

Same closed loop as `bench.client.closed_loop`: `concurrency` workers on one pooled session
(keep-alive, one connection per worker), each sending the same request back to back; latency from
just before `session.post` to the end of the body, TTFT to the first content delta of a stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp

from bench.client import LevelResult

_CONTENT = b'"content":" '  # a content delta with text, as in bench.client
_KEEP = len(_CONTENT) - 1  # bytes kept from one read to the next: too few to hold a whole marker


async def closed_loop(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    concurrency: int,
    *,
    requests: int | None = None,
    duration: float | None = None,
) -> LevelResult:
    """`concurrency` aiohttp clients each POSTing `body` to `url` back to back, until `requests`
    are done or `duration` passes."""
    res = LevelResult()
    budget = [requests if requests is not None else 1 << 62]
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    # No total timeout: a slow answer is a result, not an error (the raw client has none either).
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    all_headers = {"content-type": "application/json", **headers}
    clock = time.perf_counter
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # one request per connection first, so connection set-up is not in the figures
        await asyncio.gather(*(_one(session, url, body, all_headers) for _ in range(concurrency)))
        t0 = clock()
        deadline = t0 + duration if duration is not None else float("inf")

        async def worker() -> None:
            while budget[0] > 0:
                budget[0] -= 1
                t = clock()
                if t >= deadline:
                    return
                try:
                    status, t_first, chunks = await _one(session, url, body, all_headers)
                except aiohttp.ClientError:
                    res.errors += 1
                    continue
                if status != 200:
                    res.errors += 1
                    continue
                res.latencies.append(clock() - t)
                if t_first:
                    res.ttfts.append(t_first - t)
                res.chunks += chunks

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        res.wall = clock() - t0
    return res


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]
) -> tuple[int, float, int]:
    """(status, time of the first content delta or 0, content deltas) of one request."""
    t_first = 0.0
    chunks = 0
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.content_type == "text/event-stream":
            tail = b""  # a delta marker can straddle two reads: the last bytes of the previous one
            async for data in resp.content.iter_any():
                seen = tail + data
                n = seen.count(_CONTENT)
                tail = seen[-_KEEP:]
                if n:
                    if not chunks:
                        t_first = time.perf_counter()
                    chunks += n
        else:
            data = await resp.read()
            chunks = 1 if _CONTENT in data else 0
        return resp.status, t_first, chunks
