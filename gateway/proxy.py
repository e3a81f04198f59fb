"""The request path, top to bottom: one generation request from its body to its last byte.

serve(body)
  read it (gateway.reading): parse, resolve the model (and a pinned backend), pick the policy
                                                                            -> Request
  while the client is connected (gateway.downstream: a disconnect, or the end of a shutdown's
  grace period, cancels everything below):
    attempt; on a failure before the first byte, retry on another backend (tenacity)
      wait for capacity (gateway.admission), let the policy choose a backend
      async with Attempt (gateway.attempt: lease, upstream response)
        stream or complete (gateway.exchange)
      a failed attempt: the circuit, the metrics and the policy hear of it, its CLIENT span ends
  finally, once: the request's record (gateway.ending): the policy learns from it, Prometheus
  counts it, the access log and the CLIENT span carry it
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from gateway.access_log import AccessLog
from gateway.admission import Admission
from gateway.attempt import FAILED_UNDER, Attempt, UpstreamFailure
from gateway.background import BackgroundHolds
from gateway.baseline import SpeedupBaseline
from gateway.config import Config
from gateway.downstream import DisconnectWatch, Downstream
from gateway.ending import SHUTDOWN_MESSAGE, conclude, refused_record, settle
from gateway.errors import ApiError
from gateway.exchange import Exchange
from gateway.metrics import GatewayMetrics
from gateway.openai_request import Kind, parse
from gateway.pool import Pools
from gateway.reading import RequestReader
from gateway.records import RequestRecord, Result
from gateway.request import REQUEST_ID_HEADER, Request, request_id_of
from gateway.response_holders import ResponseLookups
from gateway.response_owners import ResponseOwners
from gateway.retry_budget import RetryBudget
from gateway.suspects import Suspects
from gateway.tracing import ClientSpan, Trace, Tracing
from policies import NoCandidate, Outcome, Policy

log = logging.getLogger("specroute.proxy")


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
        self.metrics = metrics or GatewayMetrics()
        self.tracing = tracing or Tracing(config.tracing)
        self.access_log = access_log or AccessLog(config.logging.access_log)
        self.suspects = Suspects()  # kept across reloads, which set its thresholds (configure)
        self.background = BackgroundHolds(admission)  # background Responses in flight (configure: their limit)
        self.baseline = SpeedupBaseline(pools)
        self.response_owners = ResponseOwners()  # stored Responses -> the backend that holds each
        self.response_lookups = ResponseLookups(
            self.response_owners, config.gateway.response_lookups, config.gateway.max_response_bytes
        )
        self.reader = RequestReader(pools, policies, self.response_owners, self.response_lookups, config)
        self.exchange = Exchange(config, self.metrics, self.suspects)
        self.retries = 0  # attempts beyond the first
        # The requests being answered, each with the watch that can end it (shut_down_open_requests).
        self._open: dict[DisconnectWatch, Request] = {}
        self.configure(config)

    def configure(self, config: Config) -> None:
        """(Re)read the settings the request path uses; called again on reload."""
        r = config.retry
        self.retry = r
        self.suspects.after, self.suspects.for_s = r.quarantine_after, r.quarantine_s
        self.include_prompts = config.logging.include_prompts
        self.background.max_s = config.timeouts.request_s
        self.reader.configure(config)
        self.exchange.configure(config)
        self.retry_budget = RetryBudget(r.budget_share, r.budget_window_s, r.budget_min_retries_per_s)
        # tenacity: stop after the attempts or the deadline, back off exponentially with jitter.
        self._retrying = AsyncRetrying(
            stop=stop_after_attempt(r.attempts - 1) | stop_after_delay(r.deadline_s),
            wait=wait_exponential(multiplier=r.backoff_initial_s, max=r.backoff_max_s)
            + wait_random(0, r.backoff_initial_s),
            retry=retry_if_exception_type(UpstreamFailure),
            reraise=True,
        )

    def all_policies(self) -> list[Policy]:
        """Every policy instance that routes: the models' own and those clients chose by header."""
        return self.reader.all_policies()

    # ---- the lifecycle ---------------------------------------------------------------------------

    async def serve(
        self, raw: bytes, kind: Kind, headers: Mapping[str, str], trace: Trace | None, client: Downstream
    ) -> None:
        """Answer one request on `client`. `trace`: its trace context, when the caller made it."""
        req = await self._read(raw, kind, headers, trace, client)
        if req is None:
            return
        watch = client.watch()
        self._open[watch] = req
        ending: BaseException | None = None
        try:
            async with watch:
                try:
                    await self._attempts(req, client)
                except ApiError as error:  # no attempt answered: admission, the policy, the upstream's refusal
                    ending = error
                    await self._send_error(client, error, req.request_id)
                except BaseException as e:  # the client left, the gateway shut down, or a bug (the caller answers)
                    ending = e
                    raise
            if req.shut_down:
                await self._send_shutdown(client, req.request_id)
        finally:
            del self._open[watch]
            self._finish(req, ending)

    async def _read(
        self, raw: bytes, kind: Kind, headers: Mapping[str, str], trace: Trace | None, client: Downstream
    ) -> Request | None:
        """The request read (gateway.reading), or None when it was refused: then its record is
        written and its error sent."""
        rid = request_id_of(headers)
        if trace is None:
            trace = self.tracing.current()
        model = ""
        try:
            parsed = parse(raw, kind)
            model = parsed.model[:256]  # for the record only: a client may send any string
            req = await self.reader.read(parsed, raw, headers, rid, trace, client.t_received, client.principal)
        except ApiError as error:
            client.body_read()
            self.refused(kind, error, client.t_received, rid, trace, model)
            await self._send_error(client, error, rid)
            return None
        except Exception as error:  # a bug: the caller answers 500; the request still gets its record
            client.body_read()
            bug = ApiError(500, "internal gateway error", type=type(error).__name__)
            self.refused(kind, bug, client.t_received, rid)
            raise
        client.body_read()
        self.retry_budget.request()
        return req

    async def _attempts(self, req: Request, client: Downstream) -> None:
        """The first attempt, then after a failure before the first byte the retries: the next goes
        at once to another backend (the failed ones are excluded while others exist), later ones
        after an exponential backoff with jitter, within `retry.attempts` and `retry.deadline_s`.
        The first runs outside tenacity, whose per-attempt machinery only the rare retried request
        should pay for (docs/performance.md)."""
        try:
            await self._attempt(req, client)
        except UpstreamFailure as failure:
            if req.pin is not None or self.retry.attempts <= 1:  # a pinned request never moves
                raise failure.error from None
            try:
                await self._retrying.copy()(self._attempt, req, client)
            except UpstreamFailure as last:
                raise last.error from None

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
        exchange = self.exchange.stream if req.parsed.stream else self.exchange.complete
        backend = self.pools.by_name[decision.backend.name]
        try:
            async with Attempt(req, backend, decision, self.admission, self.tracing) as attempt:
                await exchange(attempt, client)
        except UpstreamFailure as failure:
            self._attempt_failed(req, failure)
            req.last_error = failure.error
            if failure.retry == "no" or (failure.retry == "once" and req.request_errors > 0):
                raise failure.error from None  # the client's answer: no other backend is tried
            if failure.retry == "once":
                req.request_errors += 1
            raise

    def _attempt_failed(self, req: Request, failure: UpstreamFailure) -> None:
        """An attempt failed before the first byte: the quarantine, the circuit, the metrics and the
        policy hear of it, and its CLIENT span ends with what it was."""
        backend = req.backend
        assert backend is not None, "only a dispatched attempt fails upstream"
        if failure.kind in FAILED_UNDER:
            self.suspects.failed_under(req.fingerprint, backend.name)
        if failure.health:
            backend.circuit.record_failure()
        self.metrics.upstream_errors.labels(backend.name, failure.kind).inc()
        req.result = Result(status=failure.error.status, error=failure.error.message, error_type=failure.kind)
        record, outcome = conclude(req, time.perf_counter(), self.baseline, self.include_prompts)
        if outcome is not None:
            self._observe(req, outcome)
        span, req.span = req.span, None
        self.tracing.end_client_span(span, record)

    def _refuse_if_suspect(self, req: Request) -> None:
        left = self.suspects.refused_for(req.fingerprint)
        if left:
            raise ApiError(
                422,
                f"this request was in flight on {self.suspects.after} backends that failed while serving it;"
                f" it may be what makes them fail, so it is not sent to another one for {math.ceil(left)} s",
                code="request_quarantined",
            )

    # ---- the end of a request ------------------------------------------------------------------------

    def _finish(self, req: Request, ending: BaseException | None) -> None:
        """The request's single record, and everything that learns from it."""
        result, backend = req.result, req.backend
        settle(result, ending, req.shut_down)
        answered = backend if result.status == 200 else None  # the backend that answered it
        telemetry_missing = False
        if answered is not None:
            if req.kind == "responses" and req.parsed.store and result.response_id is not None:
                self.response_owners.record(result.response_id, answered.name)
                if req.parsed.background and not req.parsed.stream and result.finish_reason is None:
                    # answered `queued`: generated from now on there, counted in flight until it is done
                    self.background.hold(answered, result.response_id, req.parsed.sequences)
            # SGLang's Responses API attaches no spec details (sglext): not missing, never there.
            missing = result.read_spec(answered.spec.strategy.speculative)
            telemetry_missing = missing and req.kind != "responses"
        record, outcome = conclude(req, time.perf_counter(), self.baseline, self.include_prompts)
        if answered is not None and outcome is not None:
            self._observe(req, outcome)
            if telemetry_missing:
                self.metrics.telemetry_skipped.labels(answered.name).inc()
        span, req.span = req.span, None
        self._write_record(record, span)

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
        """The record of a request refused before it was read whole: at the door of its route (its
        body, its method: gateway.generation) or once parsed (its fields, its model)."""
        rid = request_id or request_id_of(headers or {})
        duration_s = time.perf_counter() - t_received
        self._write_record(refused_record(kind, error, duration_s, rid, trace.trace_id if trace else None, model), None)

    def _write_record(self, record: RequestRecord, span: ClientSpan | None) -> None:
        self.metrics.observe(record)
        encoded = self.access_log.write(record)
        if span is not None:
            self.tracing.end_client_span(span, record, encoded)

    # ---- shutdown ------------------------------------------------------------------------------------

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

    async def _send_shutdown(self, client: Downstream, rid: str) -> None:
        if client.status == 0:
            await self._send_error(client, ApiError(503, SHUTDOWN_MESSAGE, headers={"Retry-After": "1"}), rid)
        elif not client.complete:
            await client.fail_stream(SHUTDOWN_MESSAGE, "service_unavailable", 503)

    @staticmethod
    async def _send_error(client: Downstream, error: ApiError, rid: str) -> None:
        error.headers.setdefault(REQUEST_ID_HEADER, rid)
        await client.send_error(error)
