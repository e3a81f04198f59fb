"""One upstream attempt, as `async with Attempt(...)`: it owns what the attempt holds and gives each
back exactly once, on exit, however the attempt ends (answered, refused, failed, client gone):

- the lease on its backend (the request counts as in flight there from dispatch to exit);
- its upstream response: released to the connection pool when it was read to the end, closed
  otherwise, which makes SGLang abort the request (a client that left, a broken stream);
- its prompt, counted as pending prefill on the backend until its first token;
- its place among the backend's residents (`BackendView.residents`), the running requests whose
  TPOT another request's prefill could push past the SLO.

It tells what happened the ordinary way: `post` returns the answer or raises, and so does the
block it runs in; the proxy decides what follows. One that fails before anything reached the client
raises `UpstreamFailure`: another backend may be tried. Where it went is on the request
(`Request.dispatched`), which the request's record is written from.

While it waits for its answer, and again once a stream's headers have gone out, a backend that
stops stepping gives it up (`Backend.stalled`): the deadline it runs under (an `asyncio.timeout`
scope, `give_up_by`) expires at once. One still waiting fails as any failure before the first byte
does; a stream under way ends with an error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Literal

import aiohttp

from gateway.admission import Admission
from gateway.errors import ApiError, translate_upstream_error
from gateway.pool import Backend
from gateway.request import REQUEST_ID_HEADER, Request
from gateway.tracing import Tracing
from gateway.via import LOOP_STATUS, VIA_ENTRY, forwarded_via
from policies import Decision, Resident
from policies.prefill import causal_pairs

log = logging.getLogger("specroute.proxy")

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


class Attempt:
    """`async with Attempt(req, backend, decision, admission, tracing) as attempt:` then
    `await attempt.post(...)`."""

    __slots__ = (
        "req",
        "backend",
        "decision",
        "_admission",
        "_tracing",
        "result",
        "lease",
        "upstream_headers",
        "response",
        "reusable",
        "abandoned",
        "_scope",
        "_area0",
        "_prefill",
        "_pairs",
        "_resident",
    )

    def __init__(
        self, req: Request, backend: Backend, decision: Decision, admission: Admission, tracing: Tracing
    ) -> None:
        self.req = req
        self.backend = backend
        self.decision = decision
        self._admission = admission
        self._tracing = tracing
        self.response: aiohttp.ClientResponse | None = None
        self.reusable = False  # the response was read to its end: its connection can serve another request
        self.abandoned = False  # given up: its backend stopped stepping
        self._scope: asyncio.Timeout | None = None

    async def __aenter__(self) -> Attempt:
        backend, req = self.backend, self.req
        headers = {REQUEST_ID_HEADER: req.request_id, "Via": forwarded_via(req.headers.get("via"))}
        for h in ("traceparent", "tracestate"):  # passed on as they came, unless tracing replaces them
            if h in req.headers:
                headers[h] = req.headers[h]
        self.upstream_headers = headers
        span = self._tracing.start_client_span(req.trace, backend.address, headers)
        # The lease last: from here on nothing can fail before __aexit__ gives it back.
        self.lease = self._admission.lease(backend, req.parsed.sequences)
        now = time.perf_counter()
        req.dispatched(backend, self.decision, span, now)
        self.result = req.result
        # Until its first token this request's prompt waits to be prefilled there: the policy counts
        # it in the backend's view (SGLang prefills first come, first served).
        tokens = self.decision.prefill_tokens
        prompt = req.features.prompt_tokens
        self._prefill = prompt if tokens is None else tokens
        self._pairs = causal_pairs(prompt, self._prefill)
        backend.view.prefill_queued(self._prefill, self._pairs)
        # A request of several sequences streams their chunks interleaved: no pace to read from them.
        self._resident: Resident | None = None
        if req.parsed.sequences == 1:
            self._resident = Resident(self.result, self.decision.expected_tokens, req.features.max_tokens)
            backend.view.residents.add(self._resident)
        self._area0 = backend.inflight_area(now)
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

    def give_up_by(self, scope: asyncio.Timeout) -> None:
        """From here until `answered` (or the attempt's end), a backend that stops stepping gives
        the attempt up: it expires `scope`, the `asyncio.timeout` the attempt runs under, at once,
        and `abandoned` tells that TimeoutError from the deadline's own."""
        self._scope = scope
        self.lease.on_stall = self._abandon

    def _abandon(self) -> None:
        scope = self._scope
        if scope is not None and not scope.expired():  # not already ending by its own deadline
            self.abandoned = True
            scope.reschedule(asyncio.get_running_loop().time())

    def answered(self) -> None:
        """Its answer (or a stream's first token) is in: not given up any more, unless `give_up_by`
        again (a stream once its headers have gone out)."""
        self.lease.on_stall = None

    def first_token(self) -> None:
        """The backend has prefilled this request's prompt (it sent a token, or the attempt ended)."""
        if self._prefill:
            self.backend.view.prefill_finished(self._prefill, self._pairs)
            self._prefill, self._pairs = 0, 0.0
        self.answered()

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
        # Time-weighted in-flight on the backend over the attempt's life, itself included: before the release.
        now = time.perf_counter()
        span = now - self.req.t_dispatch
        area = self.backend.inflight_area(now) - self._area0
        self.req.mean_inflight = area / span if span > 0 else float(self.req.inflight)
        self.first_token()
        if self._resident is not None:
            self.backend.view.residents.discard(self._resident)
        self.lease.release()
        if self.lease.probe:  # a verdict (success, failure) moves the circuit on as well
            self.backend.circuit.probe_ended()
