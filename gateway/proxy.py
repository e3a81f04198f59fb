"""The request path: validate, admit, pick a backend, forward, relay, record telemetry.

Failures before the first byte reaches the client (connect error, timeout, 429/5xx, a non-streaming
answer cut short) are retried with tenacity on another member of the pool when one exists. After
the first byte nothing is replayed: a broken stream ends with an OpenAI-shaped error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Mapping

import aiohttp
import msgspec
from litestar import Response
from litestar.response import Stream
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from backends.telemetry import SpecStats, spec_stats, usage
from gateway.admission import Admission
from gateway.config import Config
from gateway.errors import ApiError, sse_error_event, translate_upstream_error
from gateway.openai_request import Kind, ParsedRequest, parse
from gateway.pool import Backend, Lease, Pools
from gateway.relay import SseRelay
from policies import Decision, NoCandidate, Outcome, Policy, RequestFeatures, classify
from policies.simple import Pinned

log = logging.getLogger("specroute.proxy")
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
BACKEND_HEADER = "x-specroute-backend"
# Upstream answers that mean "not now, not you": the request never ran there, another backend may take it.
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
_FORWARDED_HEADERS = ("x-request-id", "traceparent", "tracestate")
_NET_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class UpstreamFailure(Exception):
    """A failure before anything reached the client: safe to try another backend."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Proxy:
    def __init__(self, pools: Pools, admission: Admission, policies: Mapping[str, Policy], config: Config) -> None:
        self.pools = pools
        self.admission = admission
        self.policies = dict(policies)
        self.retry = config.retry
        t = config.timeouts
        self.first_byte_s = t.first_byte_s
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s, sock_read=t.idle_stream_s)
        self._request_timeout = aiohttp.ClientTimeout(total=t.request_s, sock_connect=t.connect_s)
        self.retries = 0  # attempts beyond the first, for metrics

    async def handle(self, raw: bytes, kind: Kind, headers: Mapping[str, str]) -> Response:
        parsed = parse(raw, kind)
        model, pin = self._resolve_target(parsed.model, headers.get(BACKEND_HEADER))
        features = RequestFeatures(
            model=model, domain=classify(parsed.prompt_text), prompt_tokens=len(parsed.prompt_text) // 4,
            max_tokens=parsed.max_tokens, stream=parsed.stream,
        )
        policy: Policy = Pinned(pin) if pin else self.policies[model]
        upstream_headers = {h: headers[h] for h in _FORWARDED_HEADERS if h in headers}
        tried: list[str] = []
        # A pinned request never moves to another backend: failing loudly beats a silent reroute.
        attempts = 1 if pin else self.retry.attempts
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts) | stop_after_delay(self.retry.deadline_s),
            wait=wait_exponential_jitter(initial=self.retry.backoff_initial_s, max=self.retry.backoff_max_s),
            retry=retry_if_exception_type(UpstreamFailure), reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if tried:
                        self.retries += 1
                    return await self._attempt(parsed, kind, model, pin, features, policy, tried, upstream_headers)
        except UpstreamFailure as failure:
            raise failure.error from None
        raise ApiError(503, f"no backend available for model {model!r}")  # unreachable: reraise=True

    async def _attempt(self, parsed: ParsedRequest, kind: Kind, model: str, pin: str | None,
                       features: RequestFeatures, policy: Policy, tried: list[str],
                       upstream_headers: dict[str, str]) -> Response:
        candidates = await self.admission.candidates(model, pin, exclude=tried)
        for b in candidates:
            b.refresh_view()
        try:
            decision = policy.choose(features, [b.view for b in candidates])
        except NoCandidate as e:
            raise ApiError(503, f"no backend available for model {model!r}: {e}", headers={"Retry-After": "1"}) from None
        backend = self.pools.by_name[decision.backend.name]
        tried.append(backend.name)
        lease = self.admission.lease(backend)
        ctx = _Context(backend, lease, decision, features, parsed, time.perf_counter(), backend.inflight, policy)
        body = self._upstream_body(parsed, backend)
        try:
            if parsed.stream:
                resp = await asyncio.wait_for(
                    backend.client.post(PATHS[kind], body, upstream_headers, self._stream_timeout), self.first_byte_s)
            else:
                resp = await backend.client.post(PATHS[kind], body, upstream_headers, self._request_timeout)
        except _NET_ERRORS as e:
            lease.release()
            backend.circuit.record_failure()
            timeout = isinstance(e, asyncio.TimeoutError)
            raise UpstreamFailure(ApiError(504 if timeout else 502, f"backend {backend.name} "
                                           f"{'timed out before answering' if timeout else 'unreachable'}: "
                                           f"{type(e).__name__}")) from None
        except BaseException:
            lease.release()
            raise
        if resp.status != 200:
            raw = await _read_quietly(resp)
            lease.release()
            error = translate_upstream_error(resp.status, raw, backend.name)
            if resp.status >= 500 and resp.status != 503:  # 503/429 = busy, not broken
                backend.circuit.record_failure()
            if resp.status in _RETRYABLE:
                raise UpstreamFailure(error)
            raise error
        if parsed.stream:
            return Stream(self._relay(resp, ctx), media_type="text/event-stream",
                          headers={BACKEND_HEADER: backend.name, "cache-control": "no-cache"})
        return await self._complete(resp, ctx)

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

    async def _relay(self, resp: aiohttp.ClientResponse, ctx: "_Context") -> AsyncIterator[bytes]:
        relay = SseRelay(keep_usage=ctx.parsed.client_wants_usage, keep_spec=ctx.parsed.client_wants_spec)
        error: str | None = None
        finished = False
        try:
            try:
                async for chunk in resp.content.iter_any():
                    out = relay.feed(chunk)
                    if out:
                        yield out
            except _NET_ERRORS as e:
                error = f"upstream stream broke: {type(e).__name__}"
            if error is None and not relay.telemetry.done:
                error = "upstream stream ended without [DONE]"
            if error is not None:
                ctx.backend.circuit.record_failure()
                yield sse_error_event(f"backend {ctx.backend.name}: {error}")
            else:
                ctx.backend.circuit.record_success()
            finished = True
        finally:
            # On a client disconnect (finished is False) closing the connection makes SGLang abort.
            resp.release() if finished else resp.close()
            ctx.lease.release()
            relay.finish_spec()
            t = relay.telemetry
            ctx.record(
                completion_tokens=t.usage.completion_tokens if t.usage else 0,
                prompt_tokens=t.usage.prompt_tokens if t.usage else 0,
                t_first=t.t_first, t_last=t.t_last, spec=t.spec, finish_reason=t.finish_reason,
                error=error or t.error or (None if finished else "client_disconnected"),
            )

    async def _complete(self, resp: aiohttp.ClientResponse, ctx: "_Context") -> Response:
        try:
            raw = await resp.read()
        except _NET_ERRORS as e:
            ctx.backend.circuit.record_failure()
            ctx.record(error=type(e).__name__)
            # Nothing reached the client yet: another backend may still answer.
            raise UpstreamFailure(ApiError(502, f"backend {ctx.backend.name} failed while answering: "
                                                f"{type(e).__name__}")) from None
        finally:
            resp.release()
            ctx.lease.release()
        try:
            obj = _decoder.decode(raw)
        except msgspec.DecodeError:
            ctx.record(error="invalid_json")
            raise ApiError(502, f"backend {ctx.backend.name} returned invalid JSON") from None
        ctx.backend.circuit.record_success()
        if not isinstance(obj, dict):
            ctx.record(error="invalid_response")
            raise ApiError(502, f"backend {ctx.backend.name} returned a non-object response")
        use = usage(obj.get("usage"))
        completion_tokens = use.completion_tokens if use else 0
        choices = obj.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        ctx.record(completion_tokens=completion_tokens, prompt_tokens=use.prompt_tokens if use else 0,
                   spec=spec_stats(obj.get("sglext"), completion_tokens), finish_reason=first.get("finish_reason"))
        if "sglext" in obj and not ctx.parsed.client_wants_spec:
            del obj["sglext"]
            raw = _encoder.encode(obj)
        return Response(raw, media_type="application/json", headers={BACKEND_HEADER: ctx.backend.name})


class _Context:
    """Everything needed to turn one finished request into a telemetry record."""

    __slots__ = ("backend", "lease", "decision", "features", "parsed", "dispatched_at", "inflight", "policy")

    def __init__(self, backend: Backend, lease: Lease, decision: Decision, features: RequestFeatures,
                 parsed: ParsedRequest, dispatched_at: float, inflight: int, policy: Policy) -> None:
        self.backend = backend
        self.lease = lease
        self.decision = decision
        self.features = features
        self.parsed = parsed
        self.dispatched_at = dispatched_at
        self.inflight = inflight
        self.policy = policy

    def record(self, *, completion_tokens: int = 0, prompt_tokens: int = 0, t_first: float | None = None,
               t_last: float | None = None, spec: SpecStats | None = None, finish_reason: str | None = None,
               error: str | None = None) -> None:
        outcome = Outcome(
            backend=self.backend.name, domain=self.features.domain, inflight_at_dispatch=self.inflight,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            ttft_s=(t_first - self.dispatched_at) if t_first is not None else None,
            decode_s=(t_last - t_first) if t_first is not None and t_last is not None else None,
            verify_ct=spec.verify_ct if spec else None, accept_length=spec.accept_length if spec else None,
            finish_reason=finish_reason, error=error,
        )
        try:
            self.policy.observe(outcome)
        except Exception:  # telemetry must never fail a request
            log.exception("policy.observe failed")


async def _read_quietly(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except _NET_ERRORS:
        return b""
    finally:
        resp.release()
