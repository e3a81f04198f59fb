"""The OpenAI generation routes (chat, completions, Responses) as litestar ASGI route handlers.

litestar routes them (under any root_path and path spelling, after its host check); they answer
over ASGI themselves rather than through litestar's Request and Response, since a stream's headers
wait for its first generated token and a client that leaves must cancel the request wherever it is
(gateway.downstream). What each does before the proxy (`Proxy.serve`) runs the request:

- a method other than POST: 405 with `Allow: POST`;
- the request's SERVER span (tracing on), made from the headers decoded here once;
- a request this gateway forwarded before: 508 (gateway.via);
- the body: at most `gateway.max_body_bytes` (413, on its announced length or on the bytes
  received), its bytes held in the gateway's body budget (gateway.body_budget: an announced body
  waits for room, one sent in chunks that would overrun it is a 503), all of it within
  `timeouts.client_body_s` (408), one `asyncio.timeout` around the read;
- every refusal recorded like any request, errors in OpenAI's shape; an unexpected exception is
  logged and answered 500, or ends a stream already started as a broken one ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from litestar.handlers import ASGIRouteHandler, asgi
from litestar.types import Receive, Scope, Send

from gateway.body_budget import BodyBudget, Reservation
from gateway.downstream import Downstream
from gateway.errors import ApiError
from gateway.openai_request import Kind
from gateway.via import forwarding_loop, has_looped

if TYPE_CHECKING:
    from gateway.config import Config
    from gateway.tracing import Trace, Tracing

__all__ = ["ROUTES", "GenerationRoutes"]

log = logging.getLogger("specroute.app")

ROUTES: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
}

Serve = Callable[[bytes, Kind, Mapping[str, str], "Trace | None", Downstream], Awaitable[None]]
# The record of a request refused here, before `Serve`: (kind, headers, error, time received).
Refused = Callable[[Kind, Mapping[str, str], ApiError, float], None]


class GenerationRoutes:
    def __init__(
        self,
        serve: Serve,
        refused: Refused,
        config: Callable[[], Config],
        tracing: Tracing | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        """`config`: the running config, read per request (a reload replaces it): its body limit
        (`gateway.max_body_bytes`) and deadline (`timeouts.client_body_s`). `budget`: the bytes of
        bodies being read at once (gateway.body_budget; None: the config's, fixed)."""
        self.serve = serve
        self.refused = refused
        self._config = config
        self.budget = budget or BodyBudget(config().gateway.max_body_bytes_in_flight)
        self.tracing = tracing if tracing is not None and tracing.enabled else None

    def handlers(self) -> list[ASGIRouteHandler]:
        return [self._handler(path, kind) for path, kind in ROUTES.items()]

    def _handler(self, path: str, kind: Kind) -> ASGIRouteHandler:
        async def generate(scope: Scope, receive: Receive, send: Send) -> None:
            await self.answer(kind, scope, receive, send)

        return asgi(path, copy_scope=False, name=f"generate-{kind}")(generate)

    async def answer(self, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope["headers"])
        client = Downstream(receive, send, scope.get("auth"))  # the door's principal (gateway.auth)
        if scope.get("method") != "POST":
            error = ApiError(405, "method not allowed for this route", headers={"Allow": "POST"})
            self.refused(kind, headers, error, client.t_received)
            return await client.send_error(error)
        tracing = self.tracing
        if tracing is None:
            await self._answer(kind, headers, receive, client, None)
            return
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
        waiting = False
        try:
            async with asyncio.timeout(timeout_s):
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
                        raise ApiError(
                            499, "client disconnected before sending its whole body", type="client_disconnected"
                        )
        except TimeoutError:
            if waiting:
                raise _over_budget(self.budget.total) from None
            raise ApiError(
                408,
                f"request body not received within {timeout_s:g}s (timeouts.client_body_s)",
                headers={"Connection": "close"},
            ) from None
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


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
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
