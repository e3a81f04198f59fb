"""The two OpenAI generation routes as plain ASGI, in front of the litestar app.

Why: litestar's per-request machinery (router, exception middleware, handler signature, Response
-> ASGIResponse conversion, anyio task group for streams) cost about a fifth of the gateway's CPU
per request. `POST /v1/chat/completions` and `POST /v1/completions` carry all the traffic, so they
are answered here; every other route, method and path variant goes to litestar unchanged.

What litestar did for these routes is kept, byte for byte on the wire: the host header check
(400), the body size limit (413 on the announced content-length, or on the bytes received), error
bodies in OpenAI's shape with their headers, `content-type` after the route's own headers (with
`; charset=utf-8` for the event stream), an unexpected exception logged and answered 500, and a
client disconnect during a stream cancelling the relay (which closes the upstream connection).
With tracing on, these routes make their SERVER span here; `Tracing.server_span_middleware` wraps
the litestar app for the other routes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from gateway.errors import ApiError
from gateway.openai_request import Kind

if TYPE_CHECKING:
    from gateway.tracing import Trace, Tracing

log = logging.getLogger("specroute.app")

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
ROUTES: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
# litestar's own host check (litestar._asgi.utils), so a bad Host header gets the same 400.
_HOST = re.compile(rb"\A[0-9A-Za-z!$&'()*+,;=\-._~:\[\]@%]*\Z", re.IGNORECASE)
_TOO_LARGE = "request body too large"


class Reply:
    """What the proxy answers: a complete body, or a stream of SSE bytes."""

    __slots__ = ("status", "headers", "body", "stream")

    def __init__(self, headers: dict[str, str], body: bytes = b"", stream: AsyncIterator[bytes] | None = None,
                 status: int = 200) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream


def _raw_headers(headers: dict[str, str], content_type: bytes, body: bytes | None) -> list[tuple[bytes, bytes]]:
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    out.append((b"content-type", content_type))
    if body is not None:
        out.append((b"content-length", str(len(body)).encode()))
    return out


async def send_error(send: Callable[[dict], Awaitable[None]], error: ApiError) -> None:
    body = error.body()
    await send({"type": "http.response.start", "status": error.status,
                "headers": _raw_headers(error.headers, b"application/json", body)})
    await send({"type": "http.response.body", "body": body})


class FastRoutes:
    """ASGI: the generation routes handled directly, the rest passed to `app` (litestar)."""

    def __init__(self, app: ASGIApp, handle: Callable[[bytes, Kind, dict[str, str], "Trace | None"], Awaitable[Reply]],
                 max_body_bytes: int, tracing: "Tracing | None" = None) -> None:
        self.app = app
        self.handle = handle
        self.max_body = max_body_bytes
        self.tracing = tracing if tracing is not None and tracing.enabled else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTES
                and not scope.get("root_path")):
            return await self._route(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _route(self, scope: dict, receive: Any, send: Any) -> None:
        headers = _headers(scope["headers"])
        tracing = self.tracing
        if tracing is None:
            await self._answer(scope, headers, receive, send, None)
            return
        # The SERVER span made here, from the headers already decoded, rather than by a middleware
        # around this app: no second pass over the headers, no wrapped `send`, one coroutine less.
        # The trace goes to the proxy as an argument, not through a context variable.
        traceparent = headers.get("traceparent")
        trace = tracing.start_server_span(traceparent, headers.get("tracestate") if traceparent else None)
        status = 0
        try:
            status = await self._answer(scope, headers, receive, send, trace)
        finally:
            tracing.end_server_span(trace, "POST", scope["path"], status)

    async def _answer(self, scope: dict, headers: dict[str, str], receive: Any, send: Any,
                      trace: "Trace | None") -> int:
        """Answers the request; returns the status sent."""
        try:
            body = await self._body(headers, receive)
            reply = await self.handle(body, ROUTES[scope["path"]], headers, trace)
        except ApiError as e:
            await send_error(send, e)
            return e.status
        except Exception as e:  # never a traceback to the client; the operator gets it in the log
            log.error("unhandled error", exc_info=e)
            await send_error(send, ApiError(500, "internal gateway error", type="api_error"))
            return 500
        if reply.stream is None:
            await send({"type": "http.response.start", "status": reply.status,
                        "headers": _raw_headers(reply.headers, b"application/json", reply.body)})
            await send({"type": "http.response.body", "body": reply.body})
            return reply.status
        await _stream(reply, receive, send)
        return reply.status

    async def _body(self, headers: dict[str, str], receive: Any) -> bytes:
        host = headers.get("host")
        if host is not None and _HOST.match(host.encode("latin-1")) is None:
            raise ApiError(400, "Invalid host header")
        announced = headers.get("content-length")
        if announced is not None:
            try:
                length = int(announced)
            except ValueError:
                raise ApiError(400, f"Invalid content-length: {announced!r}") from None
            if length > self.max_body:
                raise ApiError(413, _TOO_LARGE)
        chunks: list[bytes] = []
        total = 0
        while True:
            event = await receive()
            if event["type"] == "http.request":
                part = event.get("body", b"")
                if part:
                    total += len(part)
                    if total > self.max_body:
                        raise ApiError(413, _TOO_LARGE)
                    chunks.append(part)
                if not event.get("more_body", False):
                    break
            elif event["type"] == "http.disconnect":
                raise ApiError(500, "client disconnected prematurely")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers by lower-case name; the first of repeated headers wins (as litestar's get)."""
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        if key not in out:
            out[key] = value.decode("latin-1")
    return out


async def _stream(reply: Reply, receive: Any, send: Any) -> None:
    """Send the stream's chunks as they come; a client disconnect cancels the stream (its `finally`
    then closes the upstream connection and finishes the request's record)."""
    stream = reply.stream
    assert stream is not None
    await send({"type": "http.response.start", "status": reply.status,
                "headers": _raw_headers(reply.headers, b"text/event-stream; charset=utf-8", None)})
    relay = asyncio.current_task()
    assert relay is not None
    disconnected = done = False

    async def watch() -> None:
        nonlocal disconnected
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not done:  # servers also report disconnect once the response is complete
                    disconnected = True
                    relay.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        async for chunk in stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        done = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not disconnected:
            raise
        relay.uncancel()
    finally:
        watcher.cancel()
        await stream.aclose()  # type: ignore[attr-defined]
