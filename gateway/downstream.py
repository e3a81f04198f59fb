"""The client side of one generation request: its answer sent over ASGI, and a watch that ends the
request when the client goes away.

`Downstream.watch()` is the request's task group of two: the request's own task and a listener
that waits for `http.disconnect` (what starlette's `listen_for_disconnect` does for its streaming
responses, here for every answer, streamed or not, and for requests still waiting in the admission
queue). If the client leaves before the response is complete, the listener cancels the request's
task; whatever it was awaiting (a place in the queue, the upstream's headers, its body, the next
chunk) raises `CancelledError`, so the upstream connection is closed at once (SGLang aborts a
request whose connection closes) and every `async with` on the way releases what it holds. The
block runs in an `asyncio.timeout` scope, which the listener expires: the cancellation ends at the
watch's exit, and one from anyone else (the server's) goes on.

The gateway can end a request the same way (`DisconnectWatch.end`): at shutdown, once the grace
period is over, what is still open is cut so that its client gets an answer that says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType

from litestar.types import Receive, ReceiveMessage, Send

from gateway.body_budget import Reservation
from gateway.errors import ApiError, sse_error_event
from gateway.principal import Principal

# A stream's last event when it fails after its first byte: (message, type, code) -> its bytes.
FailureEvent = Callable[[str, str, object], bytes]

LISTEN_AFTER_S = 0.02  # see DisconnectWatch
JSON = b"application/json"
EVENT_STREAM = b"text/event-stream; charset=utf-8"


def raw_headers(headers: dict[str, str], content_type: bytes, body: bytes | None) -> list[tuple[bytes, bytes]]:
    """ASGI headers: the route's own first, then `content-type` (and `content-length` for a body)."""
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    out.append((b"content-type", content_type))
    if body is not None:
        out.append((b"content-length", str(len(body)).encode()))
    return out


class Downstream:
    """One client connection's answer. `complete` turns True just before the last byte is handed to
    the server: from then on a disconnect is the server's end-of-response notice, not a client leaving."""

    __slots__ = (
        "receive",
        "_send",
        "t_received",
        "complete",
        "status",
        "_failure_event",
        "principal",
        "body_reservation",
    )

    def __init__(self, receive: Receive, send: Send, principal: Principal | None = None) -> None:
        """`principal`: who the request comes from (gateway.auth; None: nobody known)."""
        self.receive = receive
        self._send = send
        self.principal = principal
        # the request body's share of the gateway's budget (gateway.body_budget), until it is read
        self.body_reservation: Reservation | None = None
        # The request's receipt (its headers are in): where the gateway's TTFT and duration start.
        self.t_received = time.perf_counter()
        self.complete = False
        self.status = 0  # sent so far; 0 until the response starts
        self._failure_event: FailureEvent = sse_error_event

    async def send_json(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": raw_headers(headers, JSON, body)})
        self.complete = True
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send_error(self, error: ApiError) -> None:
        await self.send_json(error.status, error.headers, error.body())

    async def start_stream(self, headers: dict[str, str], failure_event: FailureEvent = sse_error_event) -> None:
        """Starts an event stream; `failure_event` is how it ends if it fails (`fail_stream`): chat
        and completions end with an error event and [DONE], the Responses API with its own event."""
        self.status = 200
        self._failure_event = failure_event
        await self._send(
            {"type": "http.response.start", "status": 200, "headers": raw_headers(headers, EVENT_STREAM, None)}
        )

    async def send_chunk(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self) -> None:
        self.complete = True
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def fail_stream(self, message: str, type: str, code: object = None) -> None:
        """Ends a started stream that cannot go on, in the shape its API's clients read as a failure."""
        await self.send_chunk(self._failure_event(message, type, code))
        await self.end_stream()

    def body_read(self) -> None:
        """The request has been read: its body's bytes no longer count against the budget."""
        if self.body_reservation is not None:
            self.body_reservation.release()

    def watch(self) -> DisconnectWatch:
        return DisconnectWatch(self)


class DisconnectWatch:
    """`async with downstream.watch():` cancels the block if the client disconnects (`gone` says it
    did) or the gateway ends it (`end()`; `ended` says it did).

    The listener is the server's own `receive()` run as a task, read by a done-callback (no
    coroutine of ours around it, nothing to cancel at the exit): after the response, an ASGI server
    answers `receive()` with `http.disconnect` (ASGI spec), so the listener always ends; once the
    block has exited, what it hears is ignored.

    It starts `LISTEN_AFTER_S` into the block: a request answered sooner costs a timer, not a task
    (docs/performance.md). A client that leaves within that time is noticed when the listener
    starts (`receive()` then reports the disconnect at once): the upstream is aborted at most that
    late, before a real server has decoded its second token."""

    __slots__ = ("_downstream", "_scope", "_active", "_timer", "_listener", "gone", "ended")

    def __init__(self, downstream: Downstream) -> None:
        self._downstream = downstream
        self._active = False
        self.gone = False
        self.ended = False

    async def __aenter__(self) -> DisconnectWatch:
        self._scope = asyncio.timeout(None)
        await self._scope.__aenter__()
        self._active = True
        self._timer = asyncio.get_running_loop().call_later(LISTEN_AFTER_S, self._listen)
        return self

    def _listen(self) -> None:
        if self._active:  # the reference kept: the loop holds tasks only weakly
            self._listener = asyncio.ensure_future(self._downstream.receive())
            self._listener.add_done_callback(self._heard)

    def _heard(self, listener: asyncio.Future[ReceiveMessage]) -> None:
        if not self._active or listener.cancelled() or listener.exception() is not None:
            return
        if listener.result()["type"] != "http.disconnect":
            self._listen()  # not the end of the connection: listen on
        elif not self._downstream.complete and not self.ended:
            self.gone = True
            self._cut()

    def end(self) -> bool:
        """Cancels the block, once, while it runs and its answer is not complete; says if it did."""
        if self._active and not self.gone and not self.ended and not self._downstream.complete:
            self.ended = True
            self._cut()
            return True
        return False

    def _cut(self) -> None:
        if not self._scope.expired():
            self._scope.reschedule(asyncio.get_running_loop().time())

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self._active = False
        self._timer.cancel()
        try:
            await self._scope.__aexit__(exc_type, exc, tb)
        except TimeoutError:  # the scope's own cancellation, alone: it ends here
            return True
        return False
