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

With CORS configured (litestar's `CORSConfig`, gateway.app), a browser's preflight carries no key:
it passes to litestar's CORS layer, which answers it before any route runs, and the door's own
refusals carry the headers that let the page read them.
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
from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.enums import ScopeType
from litestar.types import HTTPScope, LifeSpanReceive, LifeSpanScope, LifeSpanSend, Message, Receive, Scope, Send
from litestar.utils import normalize_path

from gateway.audit import audit
from gateway.config import AuthSection, Config, ConfigError, parse_listen
from gateway.errors import ApiError
from gateway.principal import Principal
from gateway.refusals import STATUS, Refusals

__all__ = ["AuthGate", "Posture", "posture", "routed_path"]

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
        app: Litestar,
        config: Config,
        current: Callable[[], Config] | None = None,
        cors: CORSConfig | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        """`current`: where a reloaded config is found; `cors`: the app's CORS settings, if any;
        `refusals`: where refusals are counted and logged."""
        self.app = app
        self.cors = cors
        self.refusals = refusals
        self._current = current
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

    async def __call__(
        self, scope: Scope | LifeSpanScope, receive: Receive | LifeSpanReceive, send: Send | LifeSpanSend
    ) -> None:
        if scope["type"] != ScopeType.HTTP:
            return await self.app(scope, receive, send)
        await self._door(scope, receive, send)  # type: ignore[arg-type]  # an http scope: its own callables

    async def _door(self, scope: HTTPScope, receive: Receive, send: Send) -> None:
        if self._current is not None and (config := self._current()).auth is not self._section:
            self._follow(config)
        token = content_type = origin = None
        preflight = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                if token is None:
                    token = _bearer(value)
            elif name == b"content-type":
                if content_type is None:
                    content_type = value
            elif name == b"origin":
                origin = value
            elif name == b"access-control-request-method":
                preflight = True
        method = scope["method"]
        if preflight and method == "OPTIONS" and origin is not None and self.cors is not None:
            return await self.app(scope, receive, send)  # litestar's CORS layer answers it, before any route
        # the path the router will route, not the raw one: `//admin/...` is an admin route too
        path = routed_path(scope)
        if path in self.public:
            return await self.app(scope, receive, send)
        if path.startswith("/admin"):
            if self.admin_key is not None:
                if token is None or _match(token, [self.admin_key]) < 0:
                    reason = "missing_key" if token is None else "invalid_admin_key"
                    return await self._reject(scope, send, origin, reason, "a valid admin key is required")
            elif self.posture.mode != "local":
                return await self._reject(
                    scope,
                    send,
                    origin,
                    "admin_closed",
                    "the admin API is closed: no admin key is configured (auth.admin_key, or the environment "
                    f"variable {self._section.admin_key_env})",
                )
            if method == "GET":
                return await self.app(scope, receive, send)
            credential = "the admin key" if self.admin_key is not None else "local development (no keys)"
            if method == "POST" and not _is_json(content_type):
                return await self._reject(
                    scope, send, origin, "unsupported_media_type", _media_type_message(content_type)
                )
            return await _audited(self.app, scope, receive, send, path, credential)
        if self.keys:
            index = _match(token, self.keys) if token is not None else -1
            if index < 0:
                message = "missing API key (Authorization: Bearer ...)" if token is None else "invalid API key"
                reason = "missing_key" if token is None else "invalid_key"
                return await self._reject(scope, send, origin, reason, message)
            if self.buckets is not None and (wait := self.buckets[index].take()) > 0:
                return await self._reject(
                    scope,
                    send,
                    origin,
                    "rate_limited",
                    "rate limit exceeded for this API key",
                    [(b"retry-after", str(max(1, round(wait + 0.5))).encode())],
                )
            scope["auth"] = self.principals[index]
        else:
            scope["auth"] = self.anonymous
        if method == "POST" and not _is_json(content_type):
            return await self._reject(scope, send, origin, "unsupported_media_type", _media_type_message(content_type))
        return await self.app(scope, receive, send)

    async def _reject(
        self,
        scope: HTTPScope,
        send: Send,
        origin: bytes | None,
        reason: str,
        message: str,
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """The door's refusal: an OpenAI-shaped error, with the headers litestar's CORS layer would
        have added for `origin` (the refusal never reaches it): without them a page cannot read why.
        Counted and logged by `reason` (gateway/refusals.py)."""
        status = STATUS[reason]
        if self.refusals is not None:
            self.refusals.refused(
                reason, status, method=scope["method"], path=routed_path(scope), client=scope.get("client")
            )
        param = "content-type" if status == 415 else None
        body = ApiError(status, message, param=param).body()  # the error type for the status, as everywhere else
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        cors = self.cors
        if cors is not None and origin is not None:
            headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cors.simple_headers.items()]
            if not cors.is_allow_all_origins and cors.is_origin_allowed(origin.decode("latin-1")):
                headers += [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def routed_path(scope: HTTPScope) -> str:
    """The path as litestar's router matches it: without the root_path, normalised by litestar's
    own `normalize_path` (`//admin/backends` is `/admin/backends`). For what must judge a path
    before the router does: the door, and the record of a request the router refused."""
    path = scope["path"]
    if root_path := scope.get("root_path", ""):
        path = path.split(root_path, maxsplit=1)[-1]
    elif path[:1] == "/" and "//" not in path and (len(path) == 1 or path[-1] != "/"):
        return path  # normal already: the usual request, without normalize_path's regex
    return normalize_path(path)


async def _audited(app: Litestar, scope: HTTPScope, receive: Receive, send: Send, path: str, credential: str) -> None:
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


def _media_type_message(content_type: bytes | None) -> str:
    got = "none" if content_type is None else repr(content_type[:80].decode("latin-1"))
    return f"Unsupported Media Type: a POST must carry 'Content-Type: application/json' (got {got})"
