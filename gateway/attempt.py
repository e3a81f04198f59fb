"""One upstream attempt, as `async with Attempt(...)`: it owns what the attempt holds and gives each
back exactly once, on exit, however the attempt ends (answered, refused, failed, client gone):

- the lease on its backend (the request counts as in flight there from dispatch to exit);
- its CLIENT span (ended with the attempt's record);
- its upstream response: released to the connection pool when it was read to the end, closed
  otherwise, which makes SGLang abort the request (a client that left, a broken stream);
- its place among its backend's open attempts (`Backend.open_attempts`): while it waits for its
  answer, and again once a stream's headers have gone out. A backend that stops stepping gives
  them up (`abandon`): one still waiting is tried elsewhere, since nothing of it has reached the
  client; a stream under way ends with an error event.

An attempt that fails before anything reached the client raises `UpstreamFailure`: the caller
may try another backend. Any other exit makes it the request's last attempt, and the request's
single record is written (by the proxy, through `AttemptHost.attempt_ended`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp

from gateway.errors import ApiError, translate_upstream_error
from gateway.records import Result
from gateway.via import LOOP_STATUS, VIA_ENTRY, forwarded_via
from policies.prefill import causal_pairs

if TYPE_CHECKING:
    from gateway.admission import Admission
    from gateway.pool import Backend, Lease
    from gateway.proxy import Request
    from gateway.tracing import Tracing
    from policies import Decision

log = logging.getLogger("specroute.proxy")

REQUEST_ID_HEADER = "x-request-id"
# Upstream answers that mean "not now, not you": the request never ran there, another backend may take it.
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
# 503 (a full queue) and 429 mean busy, not broken: they do not count against the circuit.
BUSY = frozenset({429, 503})
# A 500 is SGLang's answer to what went wrong with this request (an exception while handling it):
# it says nothing about the backend, and the same body may fail the same way anywhere, so it is
# tried on one other backend at most, and never counted against a circuit.
REQUEST_ERRORS = frozenset({500})
_WRAPPED_503 = "503: "
NET_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
STALLED = "stopped stepping (SGLang's engine check failed)"
# Failures of a backend while it held the request: each makes the request more suspect (gateway/suspects.py).
FAILED_UNDER = frozenset({"lost", "broken_response", "engine_stalled"})


class UpstreamFailure(Exception):
    """A failure before anything reached the client. `kind` names it in metrics and spans; `health`
    says whether it counts against the backend's circuit; `retry` whether another backend may be
    tried: "yes", "once" (one more attempt for a request that had such a failure, not two: a
    request's own error), or "no" (it ran there until a deadline: running it again would double
    the time and the work)."""

    def __init__(
        self, kind: str, error: ApiError, health: bool = True, retry: Literal["yes", "once", "no"] = "yes"
    ) -> None:
        super().__init__(error.message)
        self.kind = kind
        self.error = error
        self.health = health
        self.retry = retry


class AttemptHost(Protocol):
    """What an attempt needs from the proxy that runs it."""

    admission: Admission
    tracing: Tracing

    def attempt_failed(self, attempt: Attempt, failure: UpstreamFailure) -> None: ...

    def attempt_ended(self, attempt: Attempt, error: BaseException | None, mean_inflight: float) -> None: ...


class Attempt:
    """`async with Attempt(host, req, backend, decision) as attempt:` then `await attempt.post(...)`."""

    __slots__ = (
        "_host",
        "req",
        "backend",
        "decision",
        "result",
        "lease",
        "span",
        "upstream_headers",
        "response",
        "reusable",
        "inflight",
        "t_dispatch",
        "_area0",
        "_prefill",
        "_pairs",
        "abandoned",
        "_task",
        "_cancelling",
    )

    lease: Lease
    span: tuple[Any, ...] | None  # tracing.ClientSpan
    upstream_headers: dict[str, str]
    inflight: int
    t_dispatch: float
    _area0: float

    def __init__(self, host: AttemptHost, req: Request, backend: Backend, decision: Decision) -> None:
        self._host = host
        self.req = req
        self.backend = backend
        self.decision = decision
        self.result = Result()
        self.response: aiohttp.ClientResponse | None = None
        self.reusable = False  # the response was read to its end: its connection can serve another request
        self.abandoned = False

    async def __aenter__(self) -> Attempt:
        backend, req = self.backend, self.req
        headers = {REQUEST_ID_HEADER: req.request_id, "Via": forwarded_via(req.headers.get("via"))}
        for h in ("traceparent", "tracestate"):  # passed on as they came, unless tracing replaces them
            if h in req.headers:
                headers[h] = req.headers[h]
        self.upstream_headers = headers
        self.span = self._host.tracing.start_client_span(req.trace, backend.address, headers)
        req.tried.append(backend.name)
        # The lease last: from here on nothing can fail before __aexit__ gives it back.
        self.lease = self._host.admission.lease(backend, req.parsed.sequences)
        backend.open_attempts.add(self)
        # `abandon` cancels the request's task; `taken_back` tells that cancellation from any other
        # (the count, as asyncio.timeout keeps it), so the common path costs no timeout scope.
        task = asyncio.current_task()
        assert task is not None, "an attempt runs inside a task"
        self._task = task
        self._cancelling = task.cancelling()
        # Until its first token this request's prompt waits to be prefilled there: the policy counts
        # it in the backend's view (SGLang prefills first come, first served).
        tokens = self.decision.prefill_tokens
        prompt = req.features.prompt_tokens
        self._prefill = prompt if tokens is None else tokens
        self._pairs = causal_pairs(prompt, self._prefill)
        backend.view.prefill_queued(self._prefill, self._pairs)
        self.inflight = backend.inflight
        self.t_dispatch = time.perf_counter()
        self._area0 = backend.inflight_area(self.t_dispatch)
        return self

    async def post(self, path: str, body: bytes, timeouts: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """Send the request; returns the response once its status is 200 (the attempt owns it).
        Raises UpstreamFailure for what another backend may still answer, ApiError for the rest."""
        backend = self.backend
        try:
            resp = await backend.client.post(path, body, self.upstream_headers, timeouts)
        except NET_ERRORS as e:
            if isinstance(e, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):  # never reached it
                raise self.failure("connect", 502, f"unreachable: {type(e).__name__}") from None
            if isinstance(e, asyncio.TimeoutError):  # it ran there until the deadline
                raise self.timed_out(f"timed out before answering: {type(e).__name__}") from None
            # The request went out and the connection broke before an answer: a server that died
            # with it (SGLang sends no header before a non-streamed answer or a stream's first token).
            raise self.failure("lost", 502, f"dropped the connection before answering: {type(e).__name__}") from None
        self.response = resp
        if resp.status == 200:
            return resp
        try:
            raw = await resp.read()
            self.reusable = True
        except NET_ERRORS:
            raw = b""
        if resp.status == LOOP_STATUS:
            raise self.looped(raw)
        error = translate_upstream_error(resp.status, raw, backend.name)
        if resp.status in REQUEST_ERRORS:
            raise UpstreamFailure(f"http_{resp.status}", error, health=False, retry="once")
        if resp.status in RETRYABLE:
            raise UpstreamFailure(f"http_{resp.status}", error, health=resp.status not in BUSY)
        if resp.status == 400 and error.message.startswith(_WRAPPED_503):
            # SGLang's Responses API answers a full queue (its HTTPException 503) as a 400 whose
            # message is that exception's text (serving_responses.py, the catch-all around
            # generation): busy, not a bad request, so another backend may take it.
            raise UpstreamFailure("http_503", ApiError(503, error.message[len(_WRAPPED_503) :]), health=False)
        raise error

    def first_token(self) -> None:
        """The backend has prefilled this request's prompt (it sent a token, or the attempt ended)."""
        if self._prefill:
            self.backend.view.prefill_finished(self._prefill, self._pairs)
            self._prefill, self._pairs = 0, 0.0
        self.answered()

    def streaming(self) -> None:
        """The stream's headers are out: from here `abandon` ends it rather than moving it."""
        self.backend.open_attempts.add(self)

    def answered(self) -> None:
        """Its answer (or a stream's first token) is in: not given up until `streaming`, if ever."""
        self.backend.open_attempts.discard(self)

    def abandon(self) -> None:
        """Give up the attempt (its backend stopped stepping): whatever it awaits raises
        CancelledError, which the caller hands to `taken_back`."""
        if not self.abandoned and self in self.backend.open_attempts:
            self.abandoned = True
            self._task.cancel()

    def taken_back(self) -> bool:
        """In an `except CancelledError`: True when the cancellation was `abandon`'s alone, which is
        then undone; False when it was anyone else's too (a client that left)."""
        return self.abandoned and self._task.uncancel() <= self._cancelling

    def stalled_failure(self) -> UpstreamFailure:
        """What an attempt given up before answering raises: another backend may take it."""
        # health=False: the engine check that gave it up has taken the backend out already
        return self.failure("engine_stalled", 503, f"{STALLED} before answering", False)

    def looped(self, raw: bytes) -> UpstreamFailure:
        """A gateway on the way had forwarded this request before (508, gateway.via). The one that
        found the loop names itself in its answer. This one: the backend leads back here, its
        failure, told the client as a 502. Another one: the loop is that gateway's to report, not
        this backend's fault, and its 508 goes back as it came. Either way the request is never
        sent there again."""
        backend, req = self.backend, self.req
        if VIA_ENTRY.encode() in raw:
            if not backend.loop_reported:
                backend.loop_reported = True
                log.error(
                    "backend %s (%s) forwards requests back to this gateway (508 Loop Detected): its URL, "
                    "or a gateway it leads to, points here",
                    backend.name,
                    backend.spec.url,
                )
            failure = self.failure("loop", 502, "forwards back to this gateway (508 Loop Detected): check its URL")
        else:  # the 508 as it came, `loop_detected` and all
            failure = UpstreamFailure("loop", translate_upstream_error(LOOP_STATUS, raw, backend.name), False)
        req.looped = {**(req.looped or {}), backend.name: failure.error}
        return failure

    def failure(self, kind: str, status: int, what: str, health: bool = True) -> UpstreamFailure:
        """An UpstreamFailure naming this attempt's backend: `backend NAME <what>`."""
        return UpstreamFailure(kind, ApiError(status, f"backend {self.backend.name} {what}"), health)

    def timed_out(self, what: str) -> UpstreamFailure:
        """The request ran on the backend until a deadline: the backend's failure, not to be run again."""
        return UpstreamFailure("timeout", ApiError(504, f"backend {self.backend.name} {what}"), retry="no")

    def mean_inflight(self) -> float:
        """Time-weighted in-flight on the backend over the attempt's life (itself included)."""
        now = time.perf_counter()
        span = now - self.t_dispatch
        return (self.backend.inflight_area(now) - self._area0) / span if span > 0 else float(self.inflight)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        resp = self.response
        if resp is not None:
            # Closing, not releasing, an unfinished response drops its connection: SGLang aborts the request.
            if self.reusable:
                resp.release()
            else:
                resp.close()
        mean_inflight = self.mean_inflight()  # before the release: the attempt counts itself
        self.first_token()
        self.lease.release()
        if isinstance(exc, UpstreamFailure):
            self._host.attempt_failed(self, exc)
        else:
            self._host.attempt_ended(self, exc, mean_inflight)
        if self.lease.probe:  # a verdict (success, failure) has moved the circuit on already
            self.backend.circuit.probe_ended()
