"""The OpenAI generation routes as plain ASGI, in front of the litestar app.

Why: litestar's per-request machinery (router, exception middleware, handler signature, Response
-> ASGIResponse conversion, anyio task group for streams) cost about a fifth of the gateway's CPU
per request. `POST /v1/chat/completions`, `/v1/completions` and `/v1/responses` carry all the traffic, so they
are answered here, under any root_path and path spelling litestar would route to them (its own
path normalisation); every other route and method goes to litestar unchanged.

A request this gateway forwarded before is refused with 508 (gateway.via). What litestar did for
these routes is kept, byte for byte on the wire: the host header check (400), the body size limit
(413 on the announced content-length, or on the bytes received), error bodies in OpenAI's shape
with their headers, `content-type` after the route's own headers (with `; charset=utf-8` for the
event stream), an unexpected exception logged and answered 500. The request itself runs in
`Proxy.serve`, which watches for the client leaving (gateway.downstream). With tracing on, these
routes make their SERVER span here; `Tracing.server_span_middleware` wraps the litestar app for
the other routes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from gateway.asgi import ASGIApp, Receive, Scope, Send, routed_path
from gateway.body_budget import BodyBudget, Reservation
from gateway.body_deadline import BodyDeadlines
from gateway.downstream import Downstream
from gateway.errors import ApiError
from gateway.openai_request import Kind
from gateway.principal import PRINCIPAL_SCOPE_KEY
from gateway.via import forwarding_loop, has_looped

if TYPE_CHECKING:
    from gateway.config import Config
    from gateway.tracing import Trace, Tracing

log = logging.getLogger("specroute.app")

ROUTES: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
}
# litestar's own host check (litestar._asgi.utils), so a bad Host header gets the same 400.
_HOST = re.compile(rb"\A[0-9A-Za-z!$&'()*+,;=\-._~:\[\]@%]*\Z", re.IGNORECASE)


Serve = Callable[[bytes, Kind, Mapping[str, str], "Trace | None", Downstream], Awaitable[None]]
# The record of a request refused here, before `Serve`: (kind, headers, error, time received).
Refused = Callable[[Kind, Mapping[str, str], ApiError, float], None]


class FastRoutes:
    """ASGI: the generation routes handled directly, the rest passed to `app` (litestar)."""

    def __init__(
        self,
        app: ASGIApp,
        serve: Serve,
        refused: Refused,
        config: Callable[[], Config],
        tracing: Tracing | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        """`config`: the running config, read per request (a reload replaces it): its body limit
        (`gateway.max_body_bytes`) and deadline (`timeouts.client_body_s`). `budget`: the bytes of
        bodies being read at once (gateway.body_budget; None: the config's, fixed)."""
        self.app = app
        self.serve = serve
        self.refused = refused
        self._config = config
        self._body_deadlines = BodyDeadlines()
        self.budget = budget or BodyBudget(config().gateway.max_body_bytes_in_flight)
        self.tracing = tracing if tracing is not None and tracing.enabled else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            kind = ROUTES.get(scope["path"])
            if kind is None and "completions" in scope["path"]:  # under a root_path, or another spelling
                kind = ROUTES.get(routed_path(scope))
            if kind is not None:
                if scope["method"] == "POST":
                    return await self._route(scope, kind, receive, send)
                # as litestar answers a known route's other methods
                client = Downstream(receive, send)
                error = ApiError(405, "method not allowed for this route", headers={"Allow": "POST"})
                self.refused(kind, _headers(scope["headers"]), error, client.t_received)
                return await client.send_error(error)
        return await self.app(scope, receive, send)

    async def _route(self, scope: Scope, kind: Kind, receive: Receive, send: Send) -> None:
        headers = _headers(scope["headers"])
        client = Downstream(receive, send, scope.get(PRINCIPAL_SCOPE_KEY))
        tracing = self.tracing
        if tracing is None:
            await self._answer(kind, headers, receive, client, None)
            return
        # The SERVER span made here, from the headers already decoded, rather than by a middleware
        # around this app: no second pass over the headers, no wrapped `send`, one coroutine less.
        # The trace goes to the proxy as an argument, not through a context variable.
        traceparent = headers.get("traceparent")
        trace = tracing.start_server_span(traceparent, headers.get("tracestate") if traceparent else None)
        status = 0
        try:
            status = await self._answer(kind, headers, receive, client, trace)
        finally:
            tracing.end_server_span(trace, "POST", scope["path"], status)

    async def _answer(
        self, kind: Kind, headers: dict[str, str], receive: Receive, client: Downstream, trace: Trace | None
    ) -> int:
        """Answers the request; returns the status sent."""
        reservation = Reservation(self.budget)
        client.body_reservation = reservation
        try:
            try:
                body = await self._body(headers, receive, reservation)
            except ApiError as e:
                reservation.release()
                self.refused(kind, headers, e, client.t_received)
                await client.send_error(e)
                return client.status
            try:
                await self.serve(body, kind, headers, trace, client)
            except ApiError as e:
                await client.send_error(e)
            except Exception as e:  # never a traceback to the client; the operator gets it in the log
                log.error("unhandled error", exc_info=e)
                if client.status == 0:
                    await client.send_error(ApiError(500, "internal gateway error", type="api_error"))
                elif not client.complete:  # a stream already started: end it the way a broken one ends
                    await client.fail_stream("internal gateway error", "api_error")
        finally:
            reservation.release()  # `serve` gives it back once the request is read; here if it did not
        return client.status

    async def _body(self, headers: dict[str, str], receive: Receive, reservation: Reservation) -> bytes:
        """The request's body, its bytes held in `reservation` (gateway.body_budget)."""
        config = self._config()
        max_body, timeout_s = config.gateway.max_body_bytes, config.timeouts.client_body_s
        host = headers.get("host")
        if host is not None and _HOST.match(host.encode("latin-1")) is None:
            raise ApiError(400, "Invalid host header")
        if "via" in headers and has_looped(headers["via"]):
            raise forwarding_loop()
        announced = headers.get("content-length")
        length: int | None = None
        if announced is not None:
            try:
                length = int(announced)
            except ValueError:
                raise ApiError(400, f"Invalid content-length: {announced[:40]!r}") from None
            if length > max_body:
                raise _too_large(max_body)
        chunks: list[bytes] = []
        total = 0
        deadlines = self._body_deadlines
        task = deadlines.begin(timeout_s)
        waiting = False
        try:
            if length:
                waiting = True  # the bytes stay in the client's socket until the budget has room
                if not reservation.take(length):
                    await reservation.reserve(length)
                waiting = False
            while True:
                event = await receive()
                if event["type"] == "http.request":
                    part = event.get("body", b"")
                    if part:
                        total += len(part)
                        if total > max_body:
                            raise _too_large(max_body)
                        if total > reservation.size and not reservation.grow(total - reservation.size):
                            raise _over_budget(self.budget.total)
                        chunks.append(part)
                    if not event.get("more_body", False):
                        break
                elif event["type"] == "http.disconnect":  # nobody to answer: the status is for the record
                    raise ApiError(499, "client disconnected before sending its whole body", type="client_disconnected")
        except asyncio.CancelledError:
            if not deadlines.expired(task):
                raise
            if waiting:
                raise _over_budget(self.budget.total) from None
            raise ApiError(
                408,
                f"request body not received within {timeout_s:g}s (timeouts.client_body_s)",
                headers={"Connection": "close"},
            ) from None
        finally:
            deadlines.end(task)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _over_budget(total: int) -> ApiError:
    return ApiError(
        503,
        f"the gateway is receiving other request bodies up to its limit ({total} bytes at once, "
        "gateway.max_body_bytes_in_flight): retry the request",
        headers={"Retry-After": "1"},
    )


def _too_large(max_body: int) -> ApiError:
    return ApiError(413, f"request body too large: over {max_body} bytes (gateway.max_body_bytes)")


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers by lower-case name; the first of repeated headers wins (as litestar's get),
    but `Via`'s lines are joined into one list (RFC 9110 §5.3): each names a hop (gateway.via)."""
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        if key not in out:
            out[key] = value.decode("latin-1")
        elif key == "via":
            out[key] += ", " + value.decode("latin-1")
    return out
