"""The request path: validate, admit, pick a backend, forward, relay, record telemetry.

Failures before the first byte reaches the client (connect error, timeout, 429/5xx, a non-streaming
answer cut short) are retried with tenacity (exponential backoff with jitter) on another member of
the pool when one exists; the first attempt runs outside tenacity, so the common case pays nothing. After the first byte nothing is replayed: a broken stream ends with an
OpenAI-shaped error event.

Every request ends in exactly one `RequestRecord` (`_Request.finish`), which feeds the policy,
Prometheus, the CLIENT span and the access log.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import AsyncIterator, Mapping

import aiohttp
import msgspec
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from backends.telemetry import SpecStats, spec_stats, usage
from gateway.access_log import AccessLog
from gateway.admission import Admission
from gateway.baseline import SpeedupBaseline
from gateway.config import Config
from gateway.errors import ApiError, sse_error_event, translate_upstream_error
from gateway.fast_routes import Reply
from gateway.metrics import GatewayMetrics
from gateway.openai_request import Kind, ParsedRequest, parse
from gateway.pool import Backend, Lease, Pools
from gateway.records import RequestRecord
from gateway.relay import SseRelay
from gateway.tracing import ClientSpan, Trace, Tracing
from policies import POLICY_NAMES, Decision, NoCandidate, Outcome, Policy, RequestFeatures, classify, make_policy
from policies.simple import Pinned

log = logging.getLogger("specroute.proxy")
_getrandbits = random.getrandbits
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
BACKEND_HEADER = "x-specroute-backend"
REQUEST_ID_HEADER = "x-request-id"
TRACE_ID_HEADER = "x-specroute-trace-id"
POLICY_HEADER = "x-specroute-policy"
# Upstream answers that mean "not now, not you": the request never ran there, another backend may take it.
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
_NET_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)



class UpstreamFailure(Exception):
    """A failure before anything reached the client: safe to try another backend."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Proxy:
    def __init__(self, pools: Pools, admission: Admission, policies: Mapping[str, Policy], config: Config, *,
                 metrics: GatewayMetrics | None = None, tracing: Tracing | None = None,
                 access_log: AccessLog | None = None) -> None:
        self.pools = pools
        self.admission = admission
        self.policies = policies  # shared with the runtime: a reload swaps policies in place
        self.configure(config)
        self.metrics = metrics or GatewayMetrics()
        self.tracing = tracing or Tracing(config.tracing)
        self.access_log = access_log or AccessLog(config.logging.access_log)
        self.baseline = SpeedupBaseline(pools)
        self.retries = 0  # attempts beyond the first

    def configure(self, config: Config) -> None:
        """(Re)read the settings the request path uses; called again on reload."""
        self.retry = config.retry
        self.include_prompts = config.logging.include_prompts
        self.allow_policy_header = config.gateway.allow_policy_header
        self._config = config
        t = config.timeouts
        self.first_byte_s = t.first_byte_s
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s, sock_read=t.idle_stream_s)
        self._request_timeout = aiohttp.ClientTimeout(total=t.request_s, sock_connect=t.connect_s)
        self._header_policies: dict[tuple[str, str], Policy] = {}

    def _policy_for(self, model: str, pin: str | None, requested: str | None) -> Policy:
        if pin:
            return Pinned(pin)
        if requested and requested != self.policies[model].name:
            if not self.allow_policy_header:
                raise ApiError(403, "choosing a policy per request (x-specroute-policy) is not enabled on this "
                                    "gateway (gateway.allow_policy_header)", param=POLICY_HEADER)
            key = (model, requested)
            policy = self._header_policies.get(key)
            if policy is None:  # one instance per (model, policy): it keeps learning across requests
                if requested not in POLICY_NAMES or requested == "pinned":
                    raise ApiError(400, f"unknown policy {requested!r} in {POLICY_HEADER}; expected one of "
                                        f"{[p for p in POLICY_NAMES if p != 'pinned']}", param=POLICY_HEADER)
                policy = make_policy(requested, **self._config.policy_options(model, requested))
                self._header_policies[key] = policy
            return policy
        return self.policies[model]

    async def handle(self, raw: bytes, kind: Kind, headers: Mapping[str, str], trace: Trace | None = None) -> Reply:
        """`trace`: the request's trace context, when the caller made it (else the current one)."""
        req = _Request(self, kind, headers, trace)
        try:
            parsed = parse(raw, kind)
            req.parsed = parsed
            req.model = parsed.model
            model, pin = self._resolve_target(parsed.model, headers.get(BACKEND_HEADER))
            req.model = model
            req.features = RequestFeatures(
                model=model, domain=classify(parsed.prompt_text), prompt_tokens=len(parsed.prompt_text) // 4,
                max_tokens=parsed.max_tokens, stream=parsed.stream,
            )
            req.policy = self._policy_for(model, pin, headers.get(POLICY_HEADER))
            # A pinned request never moves to another backend: failing loudly beats a silent reroute.
            attempts = 1 if pin else self.retry.attempts
            try:  # the common case: one attempt, no retry machinery on the path
                return await self._attempt(req, pin)
            except UpstreamFailure as failure:
                if attempts <= 1:
                    raise failure.error from None
            # The first retry goes at once to another backend (the failed one is excluded); later
            # ones back off exponentially with jitter, within the attempt count and the deadline.
            r = self.retry
            retrying = AsyncRetrying(
                stop=stop_after_attempt(attempts - 1) | stop_after_delay(r.deadline_s),
                wait=wait_exponential_jitter(multiplier=r.backoff_initial_s, max=r.backoff_max_s,
                                             jitter=r.backoff_initial_s),
                retry=retry_if_exception_type(UpstreamFailure), reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        return await self._attempt(req, pin)
            except UpstreamFailure as failure:
                raise failure.error from None
            raise ApiError(503, f"no backend available for model {model!r}")  # unreachable: reraise=True
        except ApiError as e:
            req.finish(status=e.status, error=e.message, error_type=e.type)
            e.headers.setdefault(REQUEST_ID_HEADER, req.request_id)
            raise

    async def _attempt(self, req: "_Request", pin: str | None) -> Reply:
        parsed, model = req.parsed, req.model
        if req.tried:
            self.retries += 1
            self.metrics.retries.labels(model).inc()
        t_wait = time.perf_counter()
        candidates = await self.admission.candidates(model, pin, exclude=req.tried)
        req.queue_s += time.perf_counter() - t_wait
        for b in candidates:
            b.refresh_view()
        try:
            decision = req.policy.choose(req.features, [b.view for b in candidates])
        except NoCandidate as e:
            raise ApiError(503, f"no backend available for model {model!r}: {e}", headers={"Retry-After": "1"}) from None
        backend = self.pools.by_name[decision.backend.name]
        req.tried.append(backend.name)
        self.metrics.decision(model, req.policy.name, backend.name)
        lease = self.admission.lease(backend)
        req.dispatch(backend, lease, decision)
        upstream_headers = {REQUEST_ID_HEADER: req.request_id}
        for h in ("traceparent", "tracestate"):  # passed on as they came, unless tracing replaces them
            if h in req.headers:
                upstream_headers[h] = req.headers[h]
        span = req.span = self.tracing.start_client_span(req.trace, backend.address, upstream_headers)
        body = self._upstream_body(parsed, backend)
        try:
            if parsed.stream:
                # asyncio.timeout, not wait_for: wait_for (3.11) runs the post in a task of its own,
                # one more task creation and wake-up per streaming request for the same deadline.
                async with asyncio.timeout(self.first_byte_s):
                    resp = await backend.client.post(PATHS[req.kind], body, upstream_headers, self._stream_timeout)
            else:
                resp = await backend.client.post(PATHS[req.kind], body, upstream_headers, self._request_timeout)
        except _NET_ERRORS as e:
            timeout = isinstance(e, asyncio.TimeoutError)
            kind = "timeout" if timeout else "connect"
            raise req.upstream_failed(kind, ApiError(
                504 if timeout else 502,
                f"backend {backend.name} {'timed out before answering' if timeout else 'unreachable'}: "
                f"{type(e).__name__}")) from None
        except BaseException:
            req.abandon("cancelled")
            raise
        if resp.status != 200:
            raw = await _read_quietly(resp)
            error = translate_upstream_error(resp.status, raw, backend.name)
            if resp.status in _RETRYABLE:
                # 503/429 mean busy, not broken: they do not count against the circuit
                raise req.upstream_failed(f"http_{resp.status}", error, health=resp.status not in (429, 503))
            req.abandon(f"http_{resp.status}", status=resp.status)
            raise error
        headers = {BACKEND_HEADER: backend.name, REQUEST_ID_HEADER: req.request_id}
        if span is not None:  # a recorded trace: the id finds it in the collector
            headers[TRACE_ID_HEADER] = req.trace_id
        if parsed.stream:
            headers["cache-control"] = "no-cache"
            return Reply(headers, stream=self._relay(resp, req))
        return await self._complete(resp, req, headers)

    def _resolve_target(self, model: str, pin_header: str | None) -> tuple[str, str | None]:
        """`kimi-k2.6@k26-eagle3` or header `x-specroute-backend` pins a backend of that model's pool."""
        pin = pin_header or None
        if model not in self.pools.by_model and "@" in model:
            model, _, pin = model.rpartition("@")
        if model not in self.pools.by_model:
            raise ApiError(404, f"model {model!r} does not exist; available: {self.pools.models()}",
                           param="model", code="model_not_found")
        if pin is not None:
            backend = self.pools.by_name.get(pin)
            if backend is None or backend.spec.model != model:
                raise ApiError(404, f"backend {pin!r} does not serve model {model!r}", param="model",
                               code="backend_not_found")
        return model, pin

    @staticmethod
    def _upstream_body(parsed: ParsedRequest, backend: Backend) -> bytes:
        body = dict(parsed.body)
        body["model"] = backend.spec.upstream_model
        if backend.spec.strategy.speculative:
            body["return_spec_tokens_details"] = True
        if parsed.stream:
            body["stream_options"] = {**(parsed.body.get("stream_options") or {}), "include_usage": True}
        return _encoder.encode(body)

    async def _relay(self, resp: aiohttp.ClientResponse, req: "_Request") -> AsyncIterator[bytes]:
        relay = SseRelay(keep_usage=req.parsed.client_wants_usage, keep_spec=req.parsed.client_wants_spec)
        error: str | None = None
        finished = False
        try:
            try:
                # readany() directly, not iter_any(): one coroutine layer less per chunk.
                read = resp.content.readany
                while True:
                    chunk = await read()
                    if not chunk:
                        break
                    out = relay.feed(chunk)
                    if out:
                        yield out
            except _NET_ERRORS as e:
                error = f"upstream stream broke: {type(e).__name__}"
            if error is None and not relay.telemetry.done:
                error = "upstream stream ended without [DONE]"
            if error is not None:
                req.backend.circuit.record_failure()
                self.metrics.upstream_errors.labels(req.backend.name, "broken_stream").inc()
                yield sse_error_event(f"backend {req.backend.name}: {error}")
            else:
                req.backend.circuit.record_success()
            finished = True
        finally:
            # On a client disconnect (finished is False) closing the connection makes SGLang abort.
            resp.release() if finished else resp.close()
            relay.finish_spec()
            t = relay.telemetry
            req.finish(
                status=200, usage_=t.usage, t_first=t.t_first, t_last=t.t_last, spec=t.spec,
                finish_reason=t.finish_reason, response_id=t.response_id, response_model=t.response_model,
                error=error or t.error or (None if finished else "client disconnected"),
                error_type="broken_stream" if error else ("upstream_error" if t.error else
                                                          (None if finished else "client_disconnected")),
                telemetry_expected=req.backend.spec.strategy.speculative and t.sglext is None,
            )

    async def _complete(self, resp: aiohttp.ClientResponse, req: "_Request", headers: dict[str, str]) -> Reply:
        try:
            raw = await resp.read()
        except _NET_ERRORS as e:
            # Nothing reached the client yet: another backend may still answer.
            raise req.upstream_failed("broken_response", ApiError(
                502, f"backend {req.backend.name} failed while answering: {type(e).__name__}")) from None
        finally:
            resp.release()
        try:
            obj = _decoder.decode(raw)
        except msgspec.DecodeError:
            obj = None
        if not isinstance(obj, dict):
            req.abandon("bad_response", status=502)
            raise ApiError(502, f"backend {req.backend.name} returned an invalid response")
        req.backend.circuit.record_success()
        use = usage(obj.get("usage"))
        choices = obj.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        sglext = obj.get("sglext")
        req.finish(status=200, usage_=use, spec=spec_stats(sglext, use.completion_tokens) if use else None,
                   finish_reason=first.get("finish_reason"),
                   response_id=obj.get("id") if isinstance(obj.get("id"), str) else None,
                   response_model=obj.get("model") if isinstance(obj.get("model"), str) else None,
                   telemetry_expected=req.backend.spec.strategy.speculative and sglext is None)
        if "sglext" in obj and not req.parsed.client_wants_spec:
            del obj["sglext"]
            raw = _encoder.encode(obj)
        return Reply(headers, raw)


class _Request:
    """One client request from arrival to its single record. `finish` runs exactly once."""

    __slots__ = ("proxy", "kind", "headers", "t_received", "request_id", "trace", "trace_id", "parsed", "model",
                 "features", "policy", "tried", "queue_s", "backend", "lease", "decision", "inflight", "t_dispatch",
                 "span", "area0", "_done")

    def __init__(self, proxy: Proxy, kind: Kind, headers: Mapping[str, str], trace: Trace | None) -> None:
        self.proxy = proxy
        self.kind = kind
        self.headers = headers
        self.t_received = time.perf_counter()
        rid = headers.get(REQUEST_ID_HEADER)
        # getrandbits, not os.urandom: a request id is not a secret, and urandom's syscall releases the
        # GIL, which another thread (the access-log writer) may then hold for a switch interval (5 ms).
        # to_bytes().hex(): half the cost of "%032x".
        self.request_id = (rid if rid and len(rid) <= 128 and rid.isprintable()
                           else _getrandbits(128).to_bytes(16, "big").hex())
        self.trace = trace if trace is not None else proxy.tracing.current()
        self.trace_id = self.trace.trace_id if self.trace is not None else None
        self.parsed: ParsedRequest = None  # type: ignore[assignment]
        self.model = ""
        self.features: RequestFeatures = None  # type: ignore[assignment]
        self.policy: Policy = None  # type: ignore[assignment]
        self.tried: list[str] = []
        self.queue_s = 0.0
        self.backend: Backend | None = None
        self.lease: Lease | None = None
        self.decision: Decision | None = None
        self.inflight = 0
        self.t_dispatch = 0.0
        self.span: ClientSpan | None = None
        self.area0 = 0.0
        self._done = False

    def dispatch(self, backend: Backend, lease: Lease, decision: Decision) -> None:
        self.backend, self.lease, self.decision = backend, lease, decision
        self.inflight = backend.inflight
        self.t_dispatch = time.perf_counter()
        self.area0 = backend.inflight_area(self.t_dispatch)

    def mean_inflight(self) -> float | None:
        """Time-weighted in-flight on the chosen backend over this request's life (itself included)."""
        if self.backend is None:
            return None
        now = time.perf_counter()
        span = now - self.t_dispatch
        return (self.backend.inflight_area(now) - self.area0) / span if span > 0 else float(self.inflight)

    def upstream_failed(self, kind: str, error: ApiError, health: bool = True) -> UpstreamFailure:
        """An attempt failed before the first byte: release it, tell the policy, allow a retry."""
        backend = self.backend
        assert backend is not None and self.lease is not None
        self.lease.release()
        if health:
            backend.circuit.record_failure()
        self.proxy.metrics.upstream_errors.labels(backend.name, kind).inc()
        self._observe(Outcome(backend=backend.name, domain=self.features.domain, inflight_at_dispatch=self.inflight,
                              error=kind))
        if self.span is not None:
            self.proxy.tracing.end_client_span(self.span, self._record(error.status, error=error.message,
                                                                       error_type=kind))
            self.span = None
        return UpstreamFailure(error)

    def abandon(self, kind: str, status: int = 499) -> None:
        """The attempt ends without a usable answer and without a retry (the error is raised after)."""
        if self.lease is not None:
            self.lease.release()
        if self.span is not None and self.backend is not None:
            self.proxy.tracing.end_client_span(self.span, self._record(status, error=kind, error_type=kind))
            self.span = None

    def finish(self, *, status: int, usage_=None, t_first: float | None = None, t_last: float | None = None,
               spec: SpecStats | None = None, finish_reason: str | None = None, response_id: str | None = None,
               response_model: str | None = None, error: str | None = None, error_type: str | None = None,
               telemetry_expected: bool = False) -> None:
        if self._done:
            return
        self._done = True
        mean_inflight = self.mean_inflight()
        if self.lease is not None:
            self.lease.release()
        rec = self._record(status, usage_=usage_, t_first=t_first, t_last=t_last, spec=spec,
                           finish_reason=finish_reason, response_id=response_id, response_model=response_model,
                           error=error, error_type=error_type)
        proxy = self.proxy
        if self.backend is not None and status == 200:
            self._observe(Outcome(
                backend=self.backend.name, domain=self.features.domain, inflight_at_dispatch=self.inflight,
                prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens,
                ttft_s=(t_first - self.t_dispatch) if t_first is not None else None,
                # Without chunk timing (non-streaming) the upstream's whole answer time stands in for
                # decode time: it includes prefill and queueing, so it slightly understates decode speed.
                decode_s=rec.decode_s if rec.decode_s is not None else (
                    time.perf_counter() - self.t_dispatch if not rec.stream else None),
                verify_ct=rec.verify_ct, accept_length=rec.accept_length, finish_reason=finish_reason,
                error=error_type if error else None, mean_inflight=mean_inflight,
            ))
            if telemetry_expected:
                proxy.metrics.telemetry_skipped.labels(self.backend.name).inc()
        proxy.metrics.observe(rec)
        encoded = proxy.access_log.write(rec)
        if self.span is not None:
            proxy.tracing.end_client_span(self.span, rec, encoded)
            self.span = None

    def _observe(self, outcome: Outcome) -> None:
        try:
            self.proxy.baseline.observe(outcome)
            self.policy.observe(outcome)
            # Pinned and header-chosen requests teach the model's configured policy too.
            model_policy = self.proxy.policies.get(self.model)
            if model_policy is not None and model_policy is not self.policy:
                model_policy.observe(outcome)
        except Exception:  # telemetry must never fail a request
            log.exception("policy.observe failed")

    def _record(self, status: int, *, usage_=None, t_first: float | None = None, t_last: float | None = None,
                spec: SpecStats | None = None, finish_reason: str | None = None, response_id: str | None = None,
                response_model: str | None = None, error: str | None = None,
                error_type: str | None = None) -> RequestRecord:
        now = time.perf_counter()
        backend, decision = self.backend, self.decision
        n = usage_.completion_tokens if usage_ else 0
        ttft = (t_first - self.t_received) if t_first is not None else None
        decode_s = (t_last - t_first) if t_first is not None and t_last is not None else None
        decode_tok_s = (n - 1) / decode_s if decode_s and n > 1 else None
        tpot = (now - t_first) / (n - 1) if t_first is not None and n > 1 else None
        domain = self.features.domain.value if self.features else None
        baseline = speedup = None
        if decode_tok_s is not None and domain is not None:
            baseline = self.proxy.baseline(self.model, domain, max(1, self.inflight))
            speedup = decode_tok_s / baseline if baseline else None
        return RequestRecord(
            request_id=self.request_id, trace_id=self.trace_id, model=self.model, kind=self.kind,
            max_tokens=self.parsed.max_tokens if self.parsed else None,
            temperature=self.parsed.temperature if self.parsed else None,
            stream=bool(self.parsed and self.parsed.stream), status=status, duration_s=now - self.t_received,
            backend=backend.name if backend else None, strategy=backend.spec.strategy.value if backend else None,
            policy=self.policy.name if self.policy else None, reason=decision.reason if decision else None,
            score=decision.score if decision else None, domain=domain, inflight=self.inflight,
            attempt=len(self.tried) or 1, queue_s=self.queue_s,
            prompt_tokens=usage_.prompt_tokens if usage_ else 0, completion_tokens=n, ttft_s=ttft, decode_s=decode_s,
            decode_tok_s=decode_tok_s, tpot_s=tpot, accept_length=spec.accept_length if spec else None,
            verify_ct=spec.verify_ct if spec else None, baseline_tok_s=baseline, speedup=speedup,
            finish_reason=finish_reason, response_id=response_id, response_model=response_model,
            error=error, error_type=error_type,
            prompt=self.parsed.prompt_text if self.proxy.include_prompts and self.parsed else None,
        )


async def _read_quietly(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except _NET_ERRORS:
        return b""
    finally:
        resp.release()
