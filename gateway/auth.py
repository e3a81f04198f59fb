"""The door: API keys, the admin key, per-key rate limits and JSON-only POSTs, as an ASGI layer
around the whole app.

It sits outside the router so that with keys configured *no* route answers without one, unknown
routes included, except the configured public probes. Keys are compared in constant time
(hmac.compare_digest against every configured key, no early exit) and never logged.

The admin API (`/admin/...`) answers the admin key alone, never an API key. With no admin key it
is closed (403 naming `auth.admin_key`), but for one case: local development, where no API key is
configured either and the gateway listens on loopback only. That is judged by the listener's
address, not the client's, since behind a sidecar proxy every client comes from loopback.

Every POST must say it carries JSON (`Content-Type: application/json`, as SGLang requires), or it
is answered 415 before anything reads it: a web page can send a `text/plain` POST to any address
without a CORS preflight, so a browser on the operator's machine could otherwise drive the API.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, routed_path
from gateway.audit import audit
from gateway.config import AuthSection, Config, ConfigError, parse_listen
from gateway.errors import ApiError
from gateway.principal import PRINCIPAL_SCOPE_KEY, Principal
from gateway.refusals import Refusals

__all__ = ["AuthGate", "Posture", "posture"]

log = logging.getLogger("specroute.auth")

Mode = Literal["keys", "local", "open"]


class Posture(msgspec.Struct, frozen=True):
    """How a config admits clients: `keys` (API keys required), `local` (no keys, loopback only:
    local development, the admin API open too) or `open` (no keys on a reachable address, as
    `auth.allow_unauthenticated` allows; the admin API needs its key)."""

    mode: Mode
    admin: bool  # the admin API answers (its key is set, or local development)
    message: str


def configured_keys(auth: AuthSection) -> tuple[list[tuple[str, Principal]], str | None]:
    """Every API key with its principal, and the admin key (None: not set)."""
    default = _range(auth.priority_range)
    keys = [(k, Principal("api_key", default)) for k in auth.api_keys]
    keys += [
        (k.strip(), Principal("api_key", default))
        for k in os.environ.get(auth.api_keys_env, "").split(",")
        if k.strip()
    ]
    for client in auth.clients:
        key = client.key if client.key is not None else os.environ.get(client.key_env or "", "")
        if key:
            keys.append((key, Principal(client.name, _range(client.priority_range) or default)))
        else:
            log.warning("auth.clients %r: its key_env %s is not set: no key", client.name, client.key_env)
    admin = auth.admin_key or os.environ.get(auth.admin_key_env) or None
    return keys, admin


def _range(value: Sequence[int]) -> tuple[int, int] | None:
    return (value[0], value[1]) if len(value) == 2 else None


def loopback_only(listen: str) -> bool:
    """The listener `HOST:PORT` is reachable from this machine alone."""
    host, _ = parse_listen(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: it may resolve to anything
        return False


def posture(config: Config) -> Posture:
    """How `config` admits clients; ConfigError when it would serve a reachable address with no
    key and has not said so (`auth.allow_unauthenticated`)."""
    keys, admin = configured_keys(config.auth)
    listen = config.gateway.listen
    if keys:
        what = f"{len(keys)} API key(s)"
        admin_state = "the admin API needs the admin key" if admin else "the admin API is closed (no auth.admin_key)"
        return Posture("keys", admin is not None, f"clients need an API key ({what}); {admin_state}")
    if loopback_only(listen):
        return Posture(
            "local",
            True,
            f"local development: no API key and a loopback listener ({listen}), so the API and the admin API "
            "are open to processes on this machine; set auth.api_keys before listening elsewhere",
        )
    if not config.auth.allow_unauthenticated:
        raise ConfigError(
            f"gateway.listen {listen!r} is reachable from other machines and no API key is configured: set "
            f"auth.api_keys (or {config.auth.api_keys_env}), or say auth.allow_unauthenticated = true"
        )
    admin_state = "the admin API needs the admin key" if admin else "the admin API is closed (no auth.admin_key)"
    return Posture(
        "open",
        admin is not None,
        f"UNAUTHENTICATED: no API key on {listen} (auth.allow_unauthenticated); {admin_state}",
    )


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
    def __init__(
        self,
        app: ASGIApp,
        config: Config,
        current: Callable[[], Config] | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        """`current`: where a reloaded config is found; `refusals`: where refusals are counted and logged."""
        self.app = app
        self._current = current
        self.refusals = refusals
        self._section = config.auth
        self._listen = config.gateway.listen
        self._configure(config)

    def _configure(self, config: Config) -> None:
        auth = config.auth
        self._section, self._listen = auth, config.gateway.listen
        self.posture = posture(config)
        keys, admin = configured_keys(auth)
        self.keys = [k.encode() for k, _ in keys]
        self.principals = [p for _, p in keys]
        self.admin_key = admin.encode() if admin else None
        self.anonymous = Principal("anonymous", _range(auth.priority_range))
        self.public = frozenset(auth.public_paths)
        burst = auth.rate_limit_burst or max(1, int(auth.rate_limit_rps))
        self.buckets = [TokenBucket(auth.rate_limit_rps, burst) for _ in keys] if auth.rate_limit_rps > 0 else None

    def _follow(self, config: Config) -> None:
        """A reload (or an admin change) made a new config: keys and limits are reset only if they
        changed, so that a rate-limited key does not get a fresh bucket with each one."""
        if config.auth != self._section or config.gateway.listen != self._listen:
            self._configure(config)
        else:
            self._section = config.auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self._current is not None and (config := self._current()).auth is not self._section:
            self._follow(config)
        token = content_type = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if token is None:
                    token = _bearer(value)
            elif name == b"content-type" and content_type is None:
                content_type = value
        # the path the router will route, not the raw one: `//admin/...` is an admin route too
        path = routed_path(scope)
        if path in self.public:
            return await self.app(scope, receive, send)
        if path.startswith("/admin"):
            if self.admin_key is not None:
                if token is None or _match(token, [self.admin_key]) < 0:
                    self._refused(scope, "missing_key" if token is None else "invalid_admin_key", path)
                    return await _reject(send, 401 if token is None else 403, "a valid admin key is required")
            elif self.posture.mode != "local":
                self._refused(scope, "admin_closed", path)
                return await _reject(
                    send,
                    403,
                    "the admin API is closed: no admin key is configured (auth.admin_key, or the environment "
                    f"variable {self._section.admin_key_env})",
                )
            if scope["method"] == "GET":
                return await self.app(scope, receive, send)
            credential = "the admin key" if self.admin_key is not None else "local development (no keys)"
            if scope["method"] == "POST" and not _is_json(content_type):
                self._refused(scope, "unsupported_media_type", path)
                return await _reject_media_type(send, content_type)
            return await _audited(self.app, scope, receive, send, path, credential)
        if self.keys:
            index = _match(token, self.keys) if token is not None else -1
            if index < 0:
                message = "missing API key (Authorization: Bearer ...)" if token is None else "invalid API key"
                self._refused(scope, "missing_key" if token is None else "invalid_key", path)
                return await _reject(send, 401, message)
            if self.buckets is not None and (wait := self.buckets[index].take()) > 0:
                self._refused(scope, "rate_limited", path)
                return await _reject(
                    send,
                    429,
                    "rate limit exceeded for this API key",
                    [(b"retry-after", str(max(1, round(wait + 0.5))).encode())],
                )
            scope[PRINCIPAL_SCOPE_KEY] = self.principals[index]
        else:
            scope[PRINCIPAL_SCOPE_KEY] = self.anonymous
        if scope["method"] == "POST" and not _is_json(content_type):
            self._refused(scope, "unsupported_media_type", path)
            return await _reject_media_type(send, content_type)
        return await self.app(scope, receive, send)

    def _refused(self, scope: Scope, reason: str, path: str) -> None:
        if self.refusals is not None:
            self.refusals.refused(
                reason, _REASON_STATUS[reason], method=scope["method"], path=path, client=scope.get("client")
            )


# The status each of the gate's refusals is answered with (gateway/refusals.py).
_REASON_STATUS = {
    "missing_key": 401,
    "invalid_key": 401,
    "invalid_admin_key": 403,
    "admin_closed": 403,
    "rate_limited": 429,
    "unsupported_media_type": 415,
}


async def _audited(app: ASGIApp, scope: Scope, receive: Receive, send: Send, path: str, credential: str) -> None:
    """Runs an admin action, then logs it with the status it got (gateway.audit)."""
    status = 0

    async def sending(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive, sending)
    finally:
        audit(f"{scope['method']} {path}", client=scope.get("client"), credential=credential, status=status)


def _bearer(value: bytes) -> bytes | None:
    scheme, _, token = value.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


def _is_json(content_type: bytes | None) -> bool:
    """`application/json`, with parameters or not, as SGLang's validate_json_request accepts it."""
    if content_type is None:
        return False
    return content_type.partition(b";")[0].strip().lower() == b"application/json"


def _match(token: bytes, keys: Sequence[bytes]) -> int:
    found = -1
    for i, key in enumerate(keys):  # no early exit: time does not depend on which key matched
        if hmac.compare_digest(token, key) and found < 0:
            found = i
    return found


async def _reject_media_type(send: Send, content_type: bytes | None) -> None:
    got = "none" if content_type is None else repr(content_type[:80].decode("latin-1"))
    await _reject(send, 415, f"Unsupported Media Type: a POST must carry 'Content-Type: application/json' (got {got})")


async def _reject(send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    param = "content-type" if status == 415 else None
    body = ApiError(status, message, param=param).body()  # the error type for the status, as everywhere else
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
