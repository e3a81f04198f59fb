"""The request path, top to bottom: one generation request from its body to its last byte.

serve(body)
  read it: parse, resolve the model (and a pinned backend), pick the policy   -> Request
  while the client is connected (downstream.py: a disconnect, or the end of a shutdown's grace
  period, cancels everything below):
    attempt; on a failure before the first byte, retry on another backend (tenacity)
      wait for capacity (admission.py), let the policy choose a backend
      async with Attempt (attempt.py: lease, CLIENT span, upstream response)
        stream:   POST, read up to the first generated token (an error event before it, as
                  SGLang sends for a full queue, fails the attempt like a 503), send the
                  headers, relay the rest (relay.py); a break after the first byte ends the
                  stream with an OpenAI-shaped error event, never a retry
        complete: POST, read the body, strip the telemetry the gateway asked for, send it
      the attempt's exit writes the request's single record (records.py): the policy learns
      from it, Prometheus counts it, the access log and the CLIENT span carry it
  an error before any attempt answered: its record, then the OpenAI-shaped error
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from backends.client import AnswerTooLarge, read_capped
from backends.telemetry import usage
from common.json_errors import JSON_DECODE_ERRORS
from gateway.access_log import AccessLog
from gateway.adapters import split_model
from gateway.admission import Admission
from gateway.attempt import (
    BUSY,
    FAILED_UNDER,
    NET_ERRORS,
    REQUEST_ERRORS,
    REQUEST_ID_HEADER,
    RETRYABLE,
    STALLED,
    Attempt,
    UpstreamFailure,
)
from gateway.background import BackgroundHolds
from gateway.baseline import SpeedupBaseline
from gateway.config import Config
from gateway.errors import ApiError, clip, model_not_found
from gateway.extras import check_extras
from gateway.metrics import GatewayMetrics
from gateway.openai_request import Kind, ParsedRequest, parse
from gateway.pool import Backend, Pools
from gateway.principal import Principal
from gateway.records import RequestRecord, Result
from gateway.relay import SseRelay, StreamRelay
from gateway.response_holders import ResponseLookups
from gateway.response_owners import ResponseOwners
from gateway.responses_relay import ResponsesRelay, read_response
from gateway.retry_budget import RetryBudget
from gateway.stream_deadline import StreamDeadline
from gateway.suspects import Suspects, body_fingerprint
from gateway.tracing import Trace, Tracing
from gateway.via import forwarded_via
from policies import POLICY_NAMES, NoCandidate, Outcome, Policy, RequestFeatures, classify, make_policy
from policies.prefix import history_blocks, namespace, text_blocks, token_blocks
from policies.simple import Pinned

if TYPE_CHECKING:
    from gateway.downstream import DisconnectWatch, Downstream

log = logging.getLogger("specroute.proxy")
_getrandbits = random.getrandbits
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "responses": "/v1/responses"}
BACKEND_HEADER = "x-specroute-backend"
TRACE_ID_HEADER = "x-specroute-trace-id"
POLICY_HEADER = "x-specroute-policy"
CHARS_PER_TOKEN = 4  # the gateway does not tokenize: its prompt-size estimate
LOGGED_CHARS = 4096  # of a prompt or an error message, in the record (access log, span)
SHUTDOWN_MESSAGE = "the gateway is shutting down: retry the request"
ANONYMOUS = Principal("anonymous", None)  # a request no door let in (tests that drive the proxy directly)


class Request:
    """One client request once read: what every attempt and its record need. `recorded` turns True
    when its single record is written; `shut_down` when the gateway's shutdown cut it."""

    __slots__ = (
        "kind",
        "headers",
        "request_id",
        "trace",
        "trace_id",
        "t_received",
        "parsed",
        "model",
        "pin",
        "adapter",
        "adapters",
        "features",
        "policy",
        "tried",
        "queue_s",
        "last",
        "recorded",
        "shut_down",
        "raw",
        "_fingerprint",
        "looped",
        "last_error",
        "request_errors",
    )

    def __init__(
        self,
        kind: Kind,
        headers: Mapping[str, str],
        request_id: str,
        trace: Trace | None,
        t_received: float,
        parsed: ParsedRequest,
        model: str,
        pin: str | None,
        features: RequestFeatures,
        policy: Policy,
        adapter: str | None = None,
    ) -> None:
        self.kind = kind
        self.headers = headers
        self.request_id = request_id
        self.trace = trace
        self.trace_id = trace.trace_id if trace is not None else None
        self.t_received = t_received
        self.parsed = parsed
        self.model = model
        self.pin = pin
        # The LoRA adapter named in `model` (sent upstream as `lora_path`), and every adapter the
        # backend must have loaded: that one, or those the body's `lora_path` names.
        self.adapter = adapter
        self.adapters = frozenset((adapter,)) if adapter is not None else parsed.lora_paths
        self.features = features
        self.policy = policy
        self.tried: list[str] = []  # backends attempted, in order
        self.queue_s = 0.0  # waiting for capacity, over all attempts
        self.last: Attempt | None = None
        self.recorded = False
        self.shut_down = False  # ended by the gateway's shutdown, not by its client or its backend
        self.raw = b""  # the body as it came
        self._fingerprint: int | None = None
        # Backends this request came back from (508, gateway.via), with the error it got there:
        # never tried again for it, as it would come back again.
        self.looped: dict[str, ApiError] | None = None
        self.last_error: ApiError | None = None  # the last failed attempt's, for when no retry may follow
        self.request_errors = 0  # attempts that failed with the request's own error (a 500)

    @property
    def fingerprint(self) -> int:
        """The body's identity for the quarantine (gateway.suspects): the same request sent again,
        however its JSON is spaced or its keys ordered. Computed on first use, which only a failure
        or a quarantine in force asks for."""
        if self._fingerprint is None:
            self._fingerprint = body_fingerprint(self.raw)
        return self._fingerprint


class Proxy:
    def __init__(
        self,
        pools: Pools,
        admission: Admission,
        policies: Mapping[str, Policy],
        config: Config,
        *,
        metrics: GatewayMetrics | None = None,
        tracing: Tracing | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self.pools = pools
        self.admission = admission
        self.policies = policies  # shared with the runtime: a reload swaps policies in place
        self.suspects = Suspects()  # kept across reloads, which set its thresholds (configure)
        self.background = BackgroundHolds(admission)  # background Responses in flight (configure: their limit)
        self.configure(config)
        self.metrics = metrics or GatewayMetrics()
        self.tracing = tracing or Tracing(config.tracing)
        self.access_log = access_log or AccessLog(config.logging.access_log)
        self.baseline = SpeedupBaseline(pools)
        self.retries = 0  # attempts beyond the first
        # The requests being answered, each with the watch that can end it (shut_down_open_requests).
        self._open: dict[DisconnectWatch, Request] = {}
        self.response_owners = ResponseOwners()  # stored Responses -> the backend that holds each
        self.response_lookups = ResponseLookups(
            self.response_owners, config.gateway.response_lookups, config.gateway.max_response_bytes
        )

    def configure(self, config: Config) -> None:
        """(Re)read the settings the request path uses; called again on reload."""
        self.retry = config.retry
        self.suspects.after, self.suspects.for_s = config.retry.quarantine_after, config.retry.quarantine_s
        self.include_prompts = config.logging.include_prompts
        self.allow_policy_header = config.gateway.allow_policy_header
        self.allowed_extras = frozenset(config.gateway.allowed_extras)
        self.max_response_bytes = config.gateway.max_response_bytes
        self.default_priority = config.admission.default_priority
        self._config = config
        t = config.timeouts
        self.background.max_s = t.request_s
        self.first_byte_s = t.first_byte_s
        self.idle_stream_s = t.idle_stream_s
        # Streams: no socket-read timeout. Real SGLang sends its headers only with the first token,
        # so the wait for them is the queue plus prefill, bounded by first_byte_s; between chunks the
        # relay keeps its own idle deadline (idle_stream_s).
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s)
        self._request_timeout = aiohttp.ClientTimeout(total=t.request_s, sock_connect=t.connect_s)
        # tenacity: stop after the attempts or the deadline, back off exponentially with jitter.
        r = config.retry
        self.retry_budget = RetryBudget(r.budget_share, r.budget_window_s, r.budget_min_retries_per_s)
        self._retrying = AsyncRetrying(
            stop=stop_after_attempt(r.attempts - 1) | stop_after_delay(r.deadline_s),
            wait=wait_exponential(multiplier=r.backoff_initial_s, max=r.backoff_max_s)
            + wait_random(0, r.backoff_initial_s),
            retry=retry_if_exception_type(UpstreamFailure),
            reraise=True,
        )
        self._header_policies: dict[tuple[str, str], Policy] = {}

    def all_policies(self) -> list[Policy]:
        """Every policy instance that routes: the models' own and those clients chose by header."""
        return [*self.policies.values(), *self._header_policies.values()]

    # ---- the lifecycle ---------------------------------------------------------------------------

    async def serve(
        self, raw: bytes, kind: Kind, headers: Mapping[str, str], trace: Trace | None, client: Downstream
    ) -> None:
        """Answer one request on `client`. `trace`: its trace context, when the caller made it."""
        t_received = client.t_received
        request_id = _request_id(headers)
        if trace is None:
            trace = self.tracing.current()
        model = ""
        try:
            parsed = parse(raw, kind)
            model = parsed.model[:256]  # for the record only: a client may send any string
            check_extras(parsed.body.client_fields(), self.allowed_extras)
            if parsed.priority is not None:
                self._clamp_priority(parsed, client)
            holder = await self._holder_of_previous(parsed, headers) if kind == "responses" else None
            req = self._request(parsed, kind, headers, request_id, trace, t_received, holder)
            req.raw = raw
            parsed.history = None  # read into the request's prefix chain: its objects are not kept
            self.retry_budget.request()
        except ApiError as error:
            client.body_read()
            self.refused(kind, error, t_received, request_id, trace, model)
            return await self._send_error(client, error, request_id)
        except Exception as error:  # a bug: the caller answers 500; the request still gets its record
            self.refused(
                kind, ApiError(500, "internal gateway error", type=type(error).__name__), t_received, request_id
            )
            raise
        client.body_read()
        watch = client.watch()
        self._open[watch] = req
        try:
            async with watch:
                try:
                    try:
                        # The first attempt outside tenacity: an AsyncRetrying pass costs 45-90 us per request
                        # (its per-iteration actions; measured on this machine, against 0.4 us for a plain
                        # call), 10-20% of the gateway's own cost per request, for the rare one that fails.
                        await self._attempt(req, client)
                    except UpstreamFailure as failure:
                        if req.pin is not None or self.retry.attempts <= 1:  # a pinned request never moves
                            raise failure.error from None
                        await self._retry(req, client)
                except ApiError as error:
                    if not req.recorded:  # no attempt answered: admission, the policy, or every retry failed
                        self._finish(
                            req, req.last, Result(status=error.status, error=error.message, error_type=error.type)
                        )
                    await self._send_error(client, error, request_id)
                except asyncio.CancelledError:
                    if not req.recorded:  # the client left (or the gateway shut down) while it waited for capacity
                        self._finish(req, None, self._cancelled(req, Result()))
                    raise
                except Exception as error:  # a bug: the caller answers 500; the request still gets its record
                    if not req.recorded:
                        self._finish(
                            req,
                            req.last,
                            Result(status=500, error="internal gateway error", error_type=type(error).__name__),
                        )
                    raise
        finally:
            del self._open[watch]
        if req.shut_down:
            await self._send_shutdown(client, request_id)

    async def _retry(self, req: Request, client: Downstream) -> None:
        """After a failure before the first byte: the next attempt goes at once to another backend
        (the failed ones are excluded while others exist), later ones after an exponential backoff
        with jitter, within `retry.attempts` and `retry.deadline_s`."""
        try:
            await self._retrying.copy()(self._attempt, req, client)
        except UpstreamFailure as failure:
            raise failure.error from None

    async def _attempt(self, req: Request, client: Downstream) -> None:
        """One attempt: wait for capacity, let the policy choose, then try that backend."""
        if self.suspects:
            self._refuse_if_suspect(req)
        if req.tried:
            if not self.retry_budget.spend() and req.last_error is not None:
                raise req.last_error  # the pool is failing too much to try again (gateway.retry_budget)
            self.retries += 1
            self.metrics.retries.labels(req.model).inc()
        t_wait = time.perf_counter()
        try:
            candidates = await self.admission.candidates(
                req.model,
                req.pin,
                exclude=req.tried,
                adapters=req.adapters,
                priority=req.parsed.priority,
                sequences=req.parsed.sequences,
            )
        finally:  # a request refused or left in the queue waited too
            req.queue_s += time.perf_counter() - t_wait
        if req.looped:
            candidates = [b for b in candidates if b.name not in req.looped]
            if not candidates:  # every backend left leads it round: the last one's answer is final
                raise list(req.looped.values())[-1]
        for b in candidates:
            b.refresh_view(candidate=True)
        try:
            decision = req.policy.choose(req.features, [b.view for b in candidates])
        except NoCandidate as e:
            raise ApiError(
                503, f"no backend available for model {req.model!r}: {e}", headers={"Retry-After": "1"}
            ) from None
        self.metrics.decision(req.model, req.policy.name, decision.backend.name)
        try:
            async with Attempt(self, req, self.pools.by_name[decision.backend.name], decision) as attempt:
                if req.parsed.stream:
                    await self._stream(attempt, client)
                else:
                    await self._complete(attempt, client)
        except UpstreamFailure as failure:
            req.last_error = failure.error
            if failure.retry == "no" or (failure.retry == "once" and req.request_errors > 0):
                raise failure.error from None  # the client's answer: no other backend is tried
            if failure.retry == "once":
                req.request_errors += 1
            raise

    async def _stream(self, attempt: Attempt, client: Downstream) -> None:
        req, backend = attempt.req, attempt.backend
        relay: StreamRelay = (
            ResponsesRelay(result=attempt.result)
            if req.kind == "responses"
            else SseRelay(
                keep_usage=req.parsed.client_wants_usage, keep_spec=req.parsed.client_wants_spec, result=attempt.result
            )
        )
        result = relay.result
        started = False
        broken: str | None = None
        try:
            # first_byte_s until the first generated token (queue and prefill on a real SGLang, which
            # sends no header before it), then idle_stream_s for each read (stream_deadline.py).
            async with StreamDeadline(self.first_byte_s, self.idle_stream_s) as deadline:
                resp = await attempt.post(PATHS[req.kind], self._upstream_body(req, backend), self._stream_timeout)
                first = await self._first_token(attempt, resp, relay)
                deadline.first_token()
                attempt.first_token()
                await client.start_stream(self._reply_headers(attempt, stream=True), relay.failure_event)
                started, result.status = True, 200  # what the client saw, whatever follows
                attempt.streaming()  # from here `abandon` ends the stream, never retries it
                if first:
                    await client.send_chunk(first)
                # readany() directly, not iter_any(): one coroutine layer less per chunk.
                read, clock = resp.content.readany, deadline.clock
                while True:
                    deadline.since = clock()
                    chunk = await read()
                    deadline.since = None
                    if not chunk:
                        break
                    out = relay.feed(chunk)
                    if out:
                        await client.send_chunk(out)
        except TimeoutError:
            if not started:
                raise attempt.timed_out(f"sent no token within {self.first_byte_s:g}s") from None
            broken = f"upstream stream idle for more than {self.idle_stream_s:g}s"
        except NET_ERRORS as e:
            if not started:
                raise attempt.failure("broken_response", 502, f"failed while answering: {type(e).__name__}") from None
            broken = f"upstream stream broke: {type(e).__name__}"
            self.suspects.failed_under(req.fingerprint, backend.name)
        except asyncio.CancelledError:  # given up by `Attempt.abandon`, or the client left
            if not attempt.taken_back():
                raise
            if not started:
                raise attempt.stalled_failure() from None
            broken = STALLED
            self.suspects.failed_under(req.fingerprint, backend.name)
        if broken is None and not result.done:
            end = "its terminal event" if req.kind == "responses" else "[DONE]"
            broken = f"upstream stream ended without {end}"
        if broken is not None:
            backend.circuit.record_failure()
            self.metrics.upstream_errors.labels(backend.name, "broken_stream").inc()
            result.error, result.error_type = broken, "broken_stream"
            await client.fail_stream(f"backend {backend.name}: {broken}", "upstream_error")
            return
        backend.circuit.record_success()
        attempt.reusable = True
        if result.error is not None:
            result.error_type = "upstream_error"
        await client.end_stream()

    async def _first_token(self, attempt: Attempt, resp: aiohttp.ClientResponse, relay: StreamRelay) -> bytes:
        """Reads the stream up to its first generated token (or its end), returning the bytes for the
        client. Nothing has reached the client yet, so an error event before that token (SGLang's
        answer to a full queue: HTTP 200, then an error with code 503) fails the attempt as a 503
        would, and so does a stream that ends without a token or [DONE]."""
        result = relay.result
        pending: list[bytes] = []
        read = resp.content.readany
        while result.t_first is None and result.error is None and not result.done:
            chunk = await read()
            if not chunk:
                break
            out = relay.feed(chunk)
            if out:
                pending.append(out)
        if result.t_first is None:
            code = result.error_code
            if result.error is not None and isinstance(code, int) and code in RETRYABLE:
                if code in REQUEST_ERRORS:
                    raise UpstreamFailure(f"stream_{code}", ApiError(code, result.error), health=False, retry="once")
                raise UpstreamFailure(f"stream_{code}", ApiError(code, result.error), health=code not in BUSY)
            if result.error is None and not result.done:
                raise attempt.failure("broken_response", 502, "ended its stream before the first token")
        return b"".join(pending)

    async def _complete(self, attempt: Attempt, client: Downstream) -> None:
        req, backend = attempt.req, attempt.backend
        try:
            resp = await attempt.post(PATHS[req.kind], self._upstream_body(req, backend), self._request_timeout)
            try:
                raw = await read_capped(resp, self.max_response_bytes)
            except AnswerTooLarge as e:  # the request's answer, not the backend's fault: no other is tried
                raise ApiError(
                    502,
                    f"backend {backend.name} answered more than {e.limit} bytes (gateway.max_response_bytes)",
                    type="upstream_error",
                ) from None
            except NET_ERRORS as e:
                raise attempt.failure("broken_response", 502, f"failed while answering: {type(e).__name__}") from None
        except asyncio.CancelledError:  # given up by `Attempt.abandon`, or the client left
            if not attempt.taken_back():
                raise
            raise attempt.stalled_failure() from None
        attempt.answered()
        attempt.reusable = True
        try:
            obj = _decoder.decode(raw)
        except JSON_DECODE_ERRORS:
            obj = None
        if not isinstance(obj, dict):
            raise ApiError(502, f"backend {backend.name} returned an invalid response")
        backend.circuit.record_success()
        result = attempt.result
        if req.kind == "responses":
            read_response(result, obj)
            result.status = 200
            await client.send_json(200, self._reply_headers(attempt, stream=False), raw)
            return
        result.usage = usage(obj.get("usage"))
        choices = obj.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        result.finish_reason = first.get("finish_reason")
        result.response_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        result.response_model = obj.get("model") if isinstance(obj.get("model"), str) else None
        result.sglext = obj.get("sglext")
        if "sglext" in obj and not req.parsed.client_wants_spec:
            del obj["sglext"]
            raw = _encoder.encode(obj)
        result.status = 200
        await client.send_json(200, self._reply_headers(attempt, stream=False), raw)

    # ---- ends of attempts and of the request (called by Attempt's exit) ------------------------------

    def _clamp_priority(self, parsed: ParsedRequest, client: Downstream) -> None:
        """A client's `priority` into the range its key may set (gateway.principal), upstream too:
        without one, any client could push other tenants' waiting requests out of the queue."""
        asked = parsed.priority
        assert asked is not None
        principal = client.principal or ANONYMOUS
        allowed = principal.clamp_priority(asked, self.default_priority)
        if allowed != asked:
            parsed.priority = allowed
            parsed.body["priority"] = allowed

    def _refuse_if_suspect(self, req: Request) -> None:
        left = self.suspects.refused_for(req.fingerprint)
        if left:
            raise ApiError(
                422,
                f"this request was in flight on {self.suspects.after} backends that failed while serving it;"
                f" it may be what makes them fail, so it is not sent to another one for {math.ceil(left)} s",
                code="request_quarantined",
            )

    def attempt_failed(self, attempt: Attempt, failure: UpstreamFailure) -> None:
        """An attempt failed before the first byte: the circuit, the metrics and the policy hear of it."""
        backend, req = attempt.backend, attempt.req
        req.last = attempt
        if failure.kind in FAILED_UNDER:
            self.suspects.failed_under(req.fingerprint, backend.name)
        if failure.health:
            backend.circuit.record_failure()
        self.metrics.upstream_errors.labels(backend.name, failure.kind).inc()
        self._observe(
            req,
            Outcome(
                backend=backend.name,
                domain=req.features.domain,
                inflight_at_dispatch=attempt.inflight,
                error=failure.kind,
                features=req.features,
            ),
        )
        if attempt.span is not None:
            result = Result(status=failure.error.status, error=failure.error.message, error_type=failure.kind)
            self.tracing.end_client_span(attempt.span, self._record(req, attempt, result))
            attempt.span = None

    def attempt_ended(self, attempt: Attempt, error: BaseException | None, mean_inflight: float) -> None:
        """The request's last attempt ended: answered, refused by the upstream, or cut short."""
        result = attempt.result
        if isinstance(error, ApiError):
            result.status, result.error, result.error_type = error.status, error.message, error.type
        elif isinstance(error, asyncio.CancelledError):
            self._cancelled(attempt.req, result)
        elif error is not None:
            result.status = result.status or 500
            result.error, result.error_type = "internal gateway error", type(error).__name__
        req = attempt.req
        req.last = attempt
        stored = req.kind == "responses" and req.parsed.store
        if stored and result.status == 200 and result.response_id is not None:
            self.response_owners.record(result.response_id, attempt.backend.name)
            if req.parsed.background and not req.parsed.stream and result.finish_reason is None:
                # answered `queued`: generated from now on there, counted in flight until it is done
                self.background.hold(attempt.backend, result.response_id, req.parsed.sequences)
        self._finish(req, attempt, result, mean_inflight)

    @staticmethod
    def _cancelled(req: Request, result: Result) -> Result:
        """The result of a request cut short by its client leaving, or by the gateway shutting down."""
        # A stream's 200 was sent already, and stays its status.
        if req.shut_down:
            result.status = result.status or 503
            result.error, result.error_type = SHUTDOWN_MESSAGE, "gateway_shutdown"
        else:
            result.status = result.status or 499
            result.error, result.error_type = "client disconnected", "client_disconnected"
        return result

    def refused(
        self,
        kind: Kind,
        error: ApiError,
        t_received: float,
        request_id: str | None = None,
        trace: Trace | None = None,
        model: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """The record of a request refused before any attempt: at the door (its host or body,
        gateway.fast_routes) or once read (its fields, its model), so that it counts in the access
        log and the metrics like any other."""
        rec = RequestRecord(
            request_id=request_id or _request_id(headers or {}),
            trace_id=trace.trace_id if trace else None,
            model=model,
            kind=kind,
            stream=False,
            status=error.status,
            duration_s=time.perf_counter() - t_received,
            error=error.message[:LOGGED_CHARS],
            error_type=error.type,
        )
        self._write_record(rec, None)

    def shut_down_open_requests(self) -> int:
        """Ends every request still being answered; returns how many. For the end of a shutdown's grace
        period: each upstream request is closed at once (SGLang aborts it), and each client is told, a
        503 with Retry-After or, once its stream has started, an error event, rather than having its
        connection dropped mid-answer."""
        ended = 0
        for watch, req in list(self._open.items()):
            req.shut_down = True
            if watch.end():
                ended += 1
            else:
                req.shut_down = False  # its answer is complete: nothing to cut
        return ended

    async def _send_shutdown(self, client: Downstream, request_id: str) -> None:
        if client.status == 0:
            await self._send_error(client, ApiError(503, SHUTDOWN_MESSAGE, headers={"Retry-After": "1"}), request_id)
        elif not client.complete:
            await client.fail_stream(SHUTDOWN_MESSAGE, "service_unavailable", 503)

    def _finish(
        self, req: Request, attempt: Attempt | None, result: Result, mean_inflight: float | None = None
    ) -> None:
        """Writes the request's single record and feeds everything that learns from it."""
        req.recorded = True
        answered = attempt is not None and result.status == 200
        # SGLang's Responses API attaches no spec details (sglext): not missing, never there.
        telemetry_missing = (
            answered
            and attempt is not None
            and result.read_spec(attempt.backend.spec.strategy.speculative)
            and req.kind != "responses"
        )
        rec = self._record(req, attempt, result)
        if answered and attempt is not None:
            self._observe(req, self._outcome(req, attempt, result, rec, mean_inflight))
            if telemetry_missing:
                self.metrics.telemetry_skipped.labels(attempt.backend.name).inc()
        self._write_record(rec, attempt)

    def _write_record(self, rec: RequestRecord, attempt: Attempt | None) -> None:
        self.metrics.observe(rec)
        encoded = self.access_log.write(rec)
        if attempt is not None and attempt.span is not None:
            self.tracing.end_client_span(attempt.span, rec, encoded)
            attempt.span = None

    def _outcome(
        self, req: Request, attempt: Attempt, result: Result, rec: RequestRecord, mean_inflight: float | None
    ) -> Outcome:
        u = result.usage
        # Without chunk timing (non-streaming, or a stream whose output was held back) the
        # upstream's whole answer time stands in for decode time: it includes prefill and queueing,
        # so it slightly understates decode speed.
        untimed = not rec.stream or _held_back(req, result)
        return Outcome(
            backend=attempt.backend.name,
            domain=req.features.domain,
            inflight_at_dispatch=attempt.inflight,
            prompt_tokens=rec.prompt_tokens or 0,
            completion_tokens=rec.completion_tokens or 0,
            sequences=rec.sequences,
            ttft_s=(result.t_first - attempt.t_dispatch) if result.t_first is not None and not untimed else None,
            decode_s=rec.decode_s
            if rec.decode_s is not None
            else (time.perf_counter() - attempt.t_dispatch if untimed else None),
            verify_ct=rec.verify_ct,
            accept_length=rec.accept_length,
            finish_reason=result.finish_reason,
            error=result.error_type if result.error else None,
            mean_inflight=mean_inflight,
            cached_tokens=u.cached_tokens if u else None,
            reasoning_tokens=u.reasoning_tokens if u else None,
            features=req.features,
        )

    def _observe(self, req: Request, outcome: Outcome) -> None:
        try:
            self.baseline.observe(outcome)
            req.policy.observe(outcome)
            # Pinned and header-chosen requests teach the model's configured policy too.
            model_policy = self.policies.get(req.model)
            if model_policy is not None and model_policy is not req.policy:
                model_policy.observe(outcome)
        except Exception:  # telemetry must never fail a request
            log.exception("policy.observe failed")

    def _record(self, req: Request, attempt: Attempt | None, result: Result) -> RequestRecord:
        now = time.perf_counter()
        u, spec, t_first, t_last = result.usage, result.spec, result.t_first, result.t_last
        n = u.completion_tokens if u else 0
        sequences = req.parsed.sequences
        per_sequence = n / sequences  # sequences decode side by side, in the same passes
        timed = not _held_back(req, result)
        decode_s = (t_last - t_first) if timed and t_first is not None and t_last is not None else None
        decode_tok_s = (per_sequence - 1) / decode_s if decode_s and per_sequence > 1 else None
        backend = attempt.backend if attempt is not None else None
        decision = attempt.decision if attempt is not None else None
        inflight = attempt.inflight if attempt is not None else 0
        domain = req.features.domain.value
        baseline = speedup = None
        if decode_tok_s is not None:
            baseline = self.baseline(req.model, domain, max(1, inflight))
            speedup = decode_tok_s / baseline if baseline else None
        parsed = req.parsed
        return RequestRecord(
            request_id=req.request_id,
            trace_id=req.trace_id,
            model=req.model,
            kind=req.kind,
            max_tokens=parsed.max_output_tokens if req.kind == "responses" else parsed.max_tokens,
            temperature=parsed.temperature,
            priority=parsed.priority,
            stream=parsed.stream,
            status=result.status,
            duration_s=now - req.t_received,
            backend=backend.name if backend else None,
            strategy=backend.spec.strategy.value if backend else None,
            policy=req.policy.name,
            reason=decision.reason if decision else None,
            score=decision.score if decision else None,
            domain=domain,
            inflight=inflight,
            attempt=len(req.tried) or 1,
            queue_s=req.queue_s,
            prompt_tokens=u.prompt_tokens if u else None,
            completion_tokens=u.completion_tokens if u else None,
            sequences=sequences,
            reasoning_tokens=u.reasoning_tokens if u else None,
            cached_tokens=u.cached_tokens if u else None,
            ttft_s=(t_first - req.t_received) if t_first is not None else None,
            ttft_answer_s=(result.t_first_answer - req.t_received) if result.t_first_answer is not None else None,
            decode_s=decode_s,
            decode_tok_s=decode_tok_s,
            tpot_s=(now - t_first) / (per_sequence - 1) if timed and t_first is not None and per_sequence > 1 else None,
            accept_length=spec.accept_length if spec else None,
            verify_ct=spec.verify_ct if spec else None,
            baseline_tok_s=baseline,
            speedup=speedup,
            finish_reason=result.finish_reason,
            response_id=result.response_id,
            response_model=result.response_model,
            error=result.error[:LOGGED_CHARS] if result.error is not None else None,
            error_type=result.error_type,
            prompt=parsed.prompt_text[:LOGGED_CHARS] if self.include_prompts else None,
        )

    # ---- reading the request -------------------------------------------------------------------------

    def _request(
        self,
        parsed: ParsedRequest,
        kind: Kind,
        headers: Mapping[str, str],
        request_id: str,
        trace: Trace | None,
        t_received: float,
        holder: str | None = None,
    ) -> Request:
        """`holder`: the backend holding a Responses request's `previous_response_id`, if any."""
        model, pin, adapter = self._resolve_target(parsed.model, headers.get(BACKEND_HEADER))
        if kind == "responses":
            chosen = parsed.request_id
            if chosen is not None and chosen in self.response_owners:
                raise ApiError(
                    409,
                    f"a Response with id {chosen!r} exists already; a new one cannot take its id",
                    param="request_id",
                    code="response_exists",
                )
            if pin is None:
                pin = holder
        if adapter is not None:
            self._check_adapters(model, pin, frozenset((adapter,)), "model")
        elif parsed.lora_paths:
            self._check_adapters(model, pin, parsed.lora_paths, "lora_path")
        policy = self._policy_for(model, pin, headers.get(POLICY_HEADER))
        features = RequestFeatures(
            model=model,
            domain=classify(parsed.prompt_text),
            prompt_tokens=len(parsed.prompt_text) // CHARS_PER_TOKEN + parsed.id_tokens,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            temperature=parsed.temperature,
            thinking=parsed.thinking,
            tools=parsed.tools,
            sequences=parsed.sequences,
            prefix=self._prefix(parsed, adapter),
        )
        return Request(kind, headers, request_id, trace, t_received, parsed, model, pin, features, policy, adapter)

    @staticmethod
    def _prefix(parsed: ParsedRequest, adapter: str | None) -> tuple[int, ...]:
        # SGLang's radix cache namespace: a prefix cached under another adapter, extra_key or
        # cache_salt is no hit (policies.prefix). A list (one per prompt of a batch) as a tuple.
        seed = 0
        lora, extra_key, salt = adapter or parsed.lora_path, parsed.extra_key, parsed.cache_salt
        if parsed.kind == "responses":
            lora = None  # SGLang's Responses API checks an adapter but runs the base model (docs/sglang-api.md)
        if lora is not None or extra_key is not None or salt is not None:
            seed = namespace(_hashable(lora), _hashable(extra_key), _hashable(salt))
        if parsed.history is not None:
            return history_blocks(parsed.history, seed)
        if parsed.prompt_ids is not None:
            return token_blocks(parsed.prompt_ids, seed)
        return text_blocks(parsed.prompt_text, seed)

    def _resolve_target(self, model: str, pin_header: str | None) -> tuple[str, str | None, str | None]:
        """(model, pinned backend, LoRA adapter). `kimi-k2.6@k26-eagle3` or header
        `x-specroute-backend` pins a backend of that model's pool; `kimi-k2.6:adapter` names an
        adapter, as SGLang's `model` does."""
        pin = pin_header or None
        if model not in self.pools.by_model and "@" in model:
            model, _, named = model.rpartition("@")
            if pin is not None and named != pin:
                raise ApiError(
                    400,
                    f"the model pins backend {clip(named)} and the {BACKEND_HEADER} header {clip(pin)}: name one",
                    param="model",
                )
            pin = named
        adapter = None
        if model not in self.pools.by_model:
            model, adapter = split_model(model, self.pools.by_model)
        if model not in self.pools.by_model:
            raise model_not_found(model, self.pools.models())
        if pin is not None:
            backend = self.pools.by_name.get(pin)
            if backend is None or backend.spec.model != model:
                raise ApiError(
                    404,
                    f"backend {clip(pin)} does not serve model {clip(model)}",
                    param="model",
                    code="backend_not_found",
                )
        return model, pin, adapter

    async def _holder_of_previous(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> str | None:
        """The backend holding `previous_response_id`'s stored Response (its id's shape checked by
        `parse`): the follow-up can be answered only there. One this gateway has no record of
        (relayed by another replica, or before a restart) is looked for among the backends of the
        request's own model (gateway.response_holders), once the model is known. None when no
        backend has it (never stored, or lost with its server's restart): the backend that gets it
        answers that it does not know it."""
        previous = parsed.previous_response_id
        if previous is None:
            return None
        model, pin, _ = self._resolve_target(parsed.model, headers.get(BACKEND_HEADER))
        if pin is not None:
            return None
        members = self.pools.by_model[model]
        holder = self.response_owners.owner(previous)
        if holder is None:
            found = await self.response_lookups.find(previous, members, via=forwarded_via(headers.get("via")))
            holder = found[0].name if found is not None else None
        return holder if any(b.name == holder for b in members) else None

    def _check_adapters(self, model: str, pin: str | None, adapters: frozenset[str], param: str) -> None:
        """404 for adapters no backend of the model (or the pinned one) has loaded: no wait can help."""
        backends = [b for b in self.pools.by_model[model] if pin is None or b.name == pin]
        if any(adapters <= b.adapters for b in backends):
            return
        loaded: frozenset[str] = frozenset().union(*(b.adapters for b in backends))
        where = f"backend {pin!r}" if pin else f"any backend of model {model!r}"
        missing = sorted(adapters - loaded)
        if missing:
            message = f"LoRA adapter {', '.join(map(clip, missing[:8]))} is not loaded on {where}"
        else:  # each is loaded somewhere, no backend has them all
            named = ", ".join(map(clip, sorted(adapters)[:8]))
            message = f"no single backend of model {model!r} has LoRA adapters [{named}] loaded together"
        raise ApiError(404, f"{message}; loaded: {sorted(loaded)}", param=param, code="model_not_found")

    def _policy_for(self, model: str, pin: str | None, requested: str | None) -> Policy:
        if pin:
            return Pinned(pin)
        if requested and requested != self.policies[model].name:
            if not self.allow_policy_header:
                raise ApiError(
                    403,
                    "choosing a policy per request (x-specroute-policy) is not enabled on this "
                    "gateway (gateway.allow_policy_header)",
                    param=POLICY_HEADER,
                )
            key = (model, requested)
            policy = self._header_policies.get(key)
            if policy is None:  # one instance per (model, policy): it keeps learning across requests
                if requested not in POLICY_NAMES or requested == "pinned":
                    raise ApiError(
                        400,
                        f"unknown policy {clip(requested)} in {POLICY_HEADER}; expected one of "
                        f"{[p for p in POLICY_NAMES if p != 'pinned']}",
                        param=POLICY_HEADER,
                    )
                policy = make_policy(requested, **self._config.policy_options(model, requested))
                self._header_policies[key] = policy
            return policy
        return self.policies[model]

    # ---- what goes upstream and back -----------------------------------------------------------------

    @staticmethod
    def _upstream_body(req: Request, backend: Backend) -> bytes:
        parsed = req.parsed
        if req.kind == "responses":  # its own fields: SGLang's ResponsesRequest has no lora_path
            model = backend.spec.upstream_model
            return parsed.body.encode({"model": model if req.adapter is None else f"{model}:{req.adapter}"})
        changes: dict[str, Any] = {"model": backend.spec.upstream_model}
        if req.adapter is not None:  # as `lora_path`: SGLang reads it whatever its served name is
            changes["lora_path"] = req.adapter
        if backend.spec.strategy.speculative:
            changes["return_spec_tokens_details"] = True
        if parsed.stream:
            changes["stream_options"] = {**(parsed.stream_options or {}), "include_usage": True}
        return parsed.body.encode(changes)

    @staticmethod
    def _reply_headers(attempt: Attempt, stream: bool) -> dict[str, str]:
        headers = {BACKEND_HEADER: attempt.backend.name, REQUEST_ID_HEADER: attempt.req.request_id}
        if attempt.span is not None and attempt.req.trace_id is not None:  # a recorded trace: the id finds it
            headers[TRACE_ID_HEADER] = attempt.req.trace_id
        if stream:
            headers["cache-control"] = "no-cache"
        return headers

    @staticmethod
    async def _send_error(client: Downstream, error: ApiError, request_id: str) -> None:
        error.headers.setdefault(REQUEST_ID_HEADER, request_id)
        await client.send_error(error)


def _hashable(value: Any) -> Any:
    """A JSON value as a hash key: lists as tuples (of hashable values, else None: not tracked apart)."""
    if isinstance(value, list):
        return tuple(value) if all(v is None or isinstance(v, (str, int)) for v in value) else None
    return value if value is None or isinstance(value, (str, int)) else None


def _held_back(req: Request, result: Result) -> bool:
    """Whether a stream's chunk times hide its decode pace: SGLang's tool-call parsers buffer the
    tokens of a call until they can parse it (`function_call/*_detector.py`,
    `parse_streaming_increment`), and its Responses API sends a request with tools its output
    events only at the end (`serving_responses.py`). Then the first token arrives late and the
    rest in a burst: a decode speed from those times is fiction (measured: 1.6M tok/s)."""
    return result.finish_reason == "tool_calls" or (req.kind == "responses" and req.parsed.tools)


def _request_id(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` when it is a sane one, else a new random id."""
    rid = headers.get(REQUEST_ID_HEADER)
    if rid and len(rid) <= 128 and rid.isprintable():
        return rid
    # getrandbits, not os.urandom: a request id is not a secret, and urandom's syscall releases the
    # GIL, which another thread (the access-log writer) may then hold for a switch interval (5 ms).
    # to_bytes().hex(): half the cost of "%032x".
    return _getrandbits(128).to_bytes(16, "big").hex()
