"""API keys, the admin key and per-key rate limits, as an ASGI layer around the whole app.

It sits outside the router so that with keys configured *no* route answers without one, unknown
routes included, except the configured public probes. Keys are compared in constant time
(hmac.compare_digest against every configured key, no early exit) and never logged.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable, Sequence

from gateway.asgi import ASGIApp, Receive, Scope, Send, routed_path
from gateway.config import AuthSection
from gateway.errors import ApiError


def configured_keys(auth: AuthSection) -> tuple[list[str], str | None]:
    keys = list(auth.api_keys)
    keys += [k.strip() for k in os.environ.get(auth.api_keys_env, "").split(",") if k.strip()]
    admin = auth.admin_key or os.environ.get(auth.admin_key_env) or None
    return keys, admin


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, burst, time.monotonic()

    def take(self) -> float:
        """0 if a request may go now, else the seconds until it may."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class AuthGate:
    def __init__(self, app: ASGIApp, auth: AuthSection, current: Callable[[], AuthSection] | None = None) -> None:
        self.app = app
        self._current = current  # where a reloaded config's [auth] is found
        self._section = auth
        self._configure(auth)

    def _configure(self, auth: AuthSection) -> None:
        self._section = auth
        keys, admin = configured_keys(auth)
        self.keys = [k.encode() for k in keys]
        self.admin_key = admin.encode() if admin else None
        self.public = frozenset(auth.public_paths)
        burst = auth.rate_limit_burst or max(1, int(auth.rate_limit_rps))
        self.buckets = [TokenBucket(auth.rate_limit_rps, burst) for _ in keys] if auth.rate_limit_rps > 0 else None

    @property
    def enabled(self) -> bool:
        return bool(self.keys or self.admin_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._current is not None and (section := self._current()) is not self._section:
            # a reload (or an admin change) made a new config: keys and limits are reset only if
            # they changed, so that a rate-limited key does not get a fresh bucket with each one
            if section != self._section:
                self._configure(section)
            else:
                self._section = section
        if scope["type"] != "http" or not self.enabled:
            return await self.app(scope, receive, send)
        # the path the router will route, not the raw one: `//admin/...` is an admin route too
        path = routed_path(scope)
        if path in self.public:
            return await self.app(scope, receive, send)
        token = _bearer(scope["headers"])
        if path.startswith("/admin"):
            # The admin key when one is set; otherwise any API key may administer.
            allowed = [self.admin_key] if self.admin_key else self.keys
            if token is None or _match(token, allowed) < 0:
                return await _reject(send, 401 if token is None else 403, "a valid admin key is required")
            return await self.app(scope, receive, send)
        index = _match(token, self.keys) if token is not None else -1
        if index < 0:
            if not self.keys:  # only an admin key is configured: the API itself is open
                return await self.app(scope, receive, send)
            message = "missing API key (Authorization: Bearer ...)" if token is None else "invalid API key"
            return await _reject(send, 401, message)
        if self.buckets is not None and (wait := self.buckets[index].take()) > 0:
            return await _reject(
                send,
                429,
                "rate limit exceeded for this API key",
                [(b"retry-after", str(max(1, round(wait + 0.5))).encode())],
            )
        return await self.app(scope, receive, send)


def _bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
    return None


def _match(token: bytes, keys: Sequence[bytes]) -> int:
    found = -1
    for i, key in enumerate(keys):  # no early exit: time does not depend on which key matched
        if hmac.compare_digest(token, key) and found < 0:
            found = i
    return found


async def _reject(send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = ApiError(status, message).body()  # the error type for the status, as everywhere else
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
