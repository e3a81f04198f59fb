"""The HTTP client for one SGLang server: pooled keep-alive aiohttp sessions per backend.

Two pools: the traffic's (`post`, `call`), sized for hundreds of requests in flight, and a small
one of its own for the gateway's probes (`get`: readiness, load, metrics, engine checks), so that a
backend whose traffic pool is full still answers its checks, and a check that waited for a pooled
connection is never taken for a hung engine.

A backend's URL may carry a path prefix (an ingress routing `https://gpu-gw/k26-dflash/...` to
one server): SGLang's paths are appended to it, never joined over it. Redirects are never followed:
the gateway forwards what the backend answers, and a redirect must not carry the backend's key or a
client's body somewhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import quote

import aiohttp
from yarl import URL

from backends.descriptor import BackendSpec
from common.keep_alive import CLIENT_KEEP_ALIVE_S

# Connections of the probes' pool: the poller's sequential checks, an engine check beside them,
# and a spare.
PROBE_CONNECTIONS = 4
# The largest probe answer read: SGLang's /metrics, its biggest, is some hundred kilobytes.
PROBE_MAX_BYTES = 8 << 20


class AnswerTooLarge(aiohttp.ClientPayloadError):
    """An answer's body is longer than the caller's cap: a broken answer to whoever catches
    aiohttp's errors, and its own kind to whoever asks."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes")
        self.limit = limit


class SGLangClient:
    """Talks to one upstream. The sessions are created lazily inside the running event loop."""

    def __init__(
        self,
        spec: BackendSpec,
        *,
        connections: int = 512,
        connect_timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`headers`: sent with every request (a gateway's `Via`); a request's own override them."""
        self.spec = spec
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        self._headers = {**(headers or {}), **({"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {})}
        self._urls: dict[str, URL] = {}

    def _new_session(self, connections: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=CLIENT_KEEP_ALIVE_S, ttl_dns_cache=300)
        # auto_decompress off: bytes are relayed as they come; skip_auto_headers keeps requests small.
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The traffic's pool."""
        if self._session is None or self._session.closed:
            self._session = self._new_session(self._connections)
        return self._session

    @property
    def probe_session(self) -> aiohttp.ClientSession:
        """The probes' own small pool."""
        if self._probe_session is None or self._probe_session.closed:
            self._probe_session = self._new_session(PROBE_CONNECTIONS)
        return self._probe_session

    async def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        timeouts: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a JSON body; the caller owns the response and must release (or close) it."""
        merged = {"Content-Type": "application/json", **self._headers, **(headers or {})}
        url = self.url(path)
        if timeouts is None:
            return await self.session.post(url, data=body, headers=merged, allow_redirects=False)
        return await self.session.post(url, data=body, headers=merged, timeout=timeouts, allow_redirects=False)

    def url(self, path: str) -> URL:
        """The backend's URL, its path prefix kept, with SGLang's `path` (and query) after it; parsed
        once per path, not per request. `path` is one of the gateway's own, never a client's."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.spec.url.rstrip("/") + path, encoded=False)
        return url

    async def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        """A small GET on the probes' pool: (status, body); network errors propagate. Waiting for
        a connection and connecting count against the connect timeout alone
        (`aiohttp.ConnectionTimeoutError`), so a caller can tell "no connection" from "no answer"."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout.connect, sock_read=timeout_s)
        async with self.probe_session.get(
            self.url(path), headers=self._headers, timeout=timeout, allow_redirects=False
        ) as r:
            return r.status, await read_capped(r, PROBE_MAX_BYTES)

    async def call(
        self,
        method: str,
        segments: Sequence[str],
        timeout_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        max_bytes: int | None = None,
    ) -> tuple[int, bytes]:
        """A small bodiless request to a path that names something (a stored Response), given as
        its segments: each is percent-encoded whole, so none can add a segment or climb out of the
        backend's path prefix. (status, body); network errors propagate, and a body over
        `max_bytes` raises AnswerTooLarge. Its URL is not kept: such paths are unbounded in number."""
        if any(s in ("", ".", "..") for s in segments):
            raise ValueError(f"not a path segment: {[s for s in segments if s in ('', '.', '..')]}")
        path = "/".join(quote(s, safe="") for s in segments)
        url = URL(self.spec.url.rstrip("/") + "/" + path, encoded=True)
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        merged = {**self._headers, **headers} if headers else self._headers
        async with self.session.request(method, url, headers=merged, timeout=timeout, allow_redirects=False) as r:
            return r.status, await read_capped(r, max_bytes)

    async def close(self) -> None:
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()
        self._session = self._probe_session = None


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int | None) -> bytes:
    """The whole body of `response`, or AnswerTooLarge once it passes `max_bytes` (None: no cap)."""
    announced = response.content_length
    if max_bytes is None or (announced is not None and announced <= max_bytes):
        return await response.read()  # within the cap as announced (aiohttp reads no more than that)
    if announced is not None:
        raise AnswerTooLarge(max_bytes)
    parts: list[bytes] = []
    size = 0
    while chunk := await response.content.read(1 << 20):
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge(max_bytes)
        parts.append(chunk)
    return b"".join(parts)
