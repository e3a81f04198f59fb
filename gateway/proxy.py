"""The request path: validate, pick a backend, forward, relay, record telemetry."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Mapping

import aiohttp
import msgspec
from litestar import Response
from litestar.response import Stream

from backends.telemetry import spec_stats, usage
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
# Statuses worth another backend: the request never started there.
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
_FORWARDED_HEADERS = ("x-request-id", "traceparent", "tracestate")


class Proxy:
    def __init__(self, pools: Pools, policies: Mapping[str, Policy], max_attempts: int = 3) -> None:
        self.pools = pools
        self.policies = dict(policies)
        self.max_attempts = max_attempts

    async def handle(self, raw: bytes, kind: Kind, headers: Mapping[str, str]) -> Response:
        parsed = parse(raw, kind)
        model, pin = self._resolve_target(parsed.model, headers.get(BACKEND_HEADER))
        features = RequestFeatures(
            model=model, domain=classify(parsed.prompt_text), prompt_tokens=len(parsed.prompt_text) // 4,
            max_tokens=parsed.max_tokens, stream=parsed.stream,
        )
        policy: Policy = Pinned(pin) if pin else self.policies[model]
        upstream_headers = {h: headers[h] for h in _FORWARDED_HEADERS if h in headers}
        tried: set[str] = set()
        last_error: ApiError | None = None
        # A pinned request never moves to another backend: failing loudly beats a silent reroute.
        attempts = 1 if pin else self.max_attempts
        for _ in range(attempts):
            candidates = [v for v in self.pools.views[model] if v.name not in tried]
            if not candidates:
                break
            try:
                decision = policy.choose(features, candidates)
            except NoCandidate as e:
                raise ApiError(503, f"no backend available for model {model!r}: {e}") from None
            backend = self.pools.by_name[decision.backend.name]
            tried.add(backend.name)
            lease = backend.lease()
            dispatched_at = time.perf_counter()
            inflight_at_dispatch = backend.inflight
            try:
                resp = await backend.client.post(PATHS[kind], self._upstream_body(parsed, backend), upstream_headers)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                lease.release()
                last_error = ApiError(502, f"backend {backend.name} unreachable: {type(e).__name__}")
                continue
            except BaseException:
                lease.release()
                raise
            if resp.status != 200:
                body = await _read_quietly(resp)
                lease.release()
                last_error = translate_upstream_error(resp.status, body, backend.name)
                if resp.status in _RETRYABLE:
                    continue
                raise last_error
            ctx = _Context(backend, lease, decision, features, parsed, dispatched_at, inflight_at_dispatch, policy)
            if parsed.stream:
                return Stream(
                    self._relay(resp, ctx), media_type="text/event-stream",
                    headers={BACKEND_HEADER: backend.name, "cache-control": "no-cache"},
                )
            return await self._complete(resp, ctx)
        raise last_error or ApiError(503, f"no backend available for model {model!r}")

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
        try:
            try:
                async for chunk in resp.content.iter_any():
                    out = relay.feed(chunk)
                    if out:
                        yield out
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                error = f"upstream stream broke: {type(e).__name__}"
            if error is None and not relay.telemetry.done:
                error = "upstream stream ended without [DONE]"
            if error is not None:
                yield sse_error_event(f"backend {ctx.backend.name}: {error}")
        finally:
            resp.release()
            ctx.lease.release()
            relay.finish_spec()
            t = relay.telemetry
            ctx.record(
                completion_tokens=t.usage.completion_tokens if t.usage else 0,
                prompt_tokens=t.usage.prompt_tokens if t.usage else 0,
                t_first=t.t_first, t_last=t.t_last, spec=t.spec, finish_reason=t.finish_reason,
                error=error or t.error,
            )

    async def _complete(self, resp: aiohttp.ClientResponse, ctx: "_Context") -> Response:
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            ctx.record(error=type(e).__name__)
            raise ApiError(502, f"backend {ctx.backend.name} failed while answering: {type(e).__name__}") from None
        finally:
            resp.release()
            ctx.lease.release()
        t_done = time.perf_counter()
        try:
            obj = _decoder.decode(raw)
        except msgspec.DecodeError:
            ctx.record(error="invalid_json")
            raise ApiError(502, f"backend {ctx.backend.name} returned invalid JSON") from None
        use = usage(obj.get("usage")) if isinstance(obj, dict) else None
        completion_tokens = use.completion_tokens if use else 0
        spec = spec_stats(obj.get("sglext"), completion_tokens) if isinstance(obj, dict) else None
        choices = obj.get("choices") if isinstance(obj, dict) else None
        finish = choices[0].get("finish_reason") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        ctx.record(completion_tokens=completion_tokens, prompt_tokens=use.prompt_tokens if use else 0,
                   t_done=t_done, spec=spec, finish_reason=finish)
        if isinstance(obj, dict) and "sglext" in obj and not ctx.parsed.client_wants_spec:
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
               t_last: float | None = None, t_done: float | None = None, spec=None,
               finish_reason: str | None = None, error: str | None = None) -> None:
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
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return b""
    finally:
        resp.release()
