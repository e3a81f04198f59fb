"""The HTTP client for one SGLang server: one pooled keep-alive aiohttp session per backend.

A backend's URL may carry a path prefix (an ingress routing `https://gpu-gw/k26-dflash/...` to
one server): SGLang's paths are appended to it, never joined over it."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from yarl import URL

from backends.descriptor import BackendSpec
from common.keep_alive import CLIENT_KEEP_ALIVE_S


class SGLangClient:
    """Talks to one upstream. The session is created lazily inside the running event loop."""

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
        self._headers = {**(headers or {}), **({"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {})}
        self._urls: dict[str, URL] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._connections, keepalive_timeout=CLIENT_KEEP_ALIVE_S, ttl_dns_cache=300
            )
            # auto_decompress off: bytes are relayed as they come; skip_auto_headers keeps requests small.
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

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
            return await self.session.post(url, data=body, headers=merged)
        return await self.session.post(url, data=body, headers=merged, timeout=timeouts)

    def url(self, path: str) -> URL:
        """The backend's URL, its path prefix kept, with SGLang's `path` (and query) after it; parsed
        once per path, not per request."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.spec.url.rstrip("/") + path, encoded=False)
        return url

    async def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        """A small GET for probes and polling: (status, body); network errors propagate."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self.session.get(self.url(path), headers=self._headers, timeout=timeout) as r:
            return r.status, await r.read()

    async def call(
        self, method: str, path: str, timeout_s: float = 30.0, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """A small bodiless request to a path that names something (a stored Response): (status,
        body); network errors propagate. Its URL is not kept: such paths are unbounded in number."""
        url = URL(self.spec.url.rstrip("/") + path, encoded=False)
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        merged = {**self._headers, **headers} if headers else self._headers
        async with self.session.request(method, url, headers=merged, timeout=timeout) as r:
            return r.status, await r.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
