"""One attempt's exchange with its backend, and the client's answer: what goes upstream and back.

stream:   POST, read up to the first generated token (an error event before it, as SGLang sends
          for a full queue, fails the attempt like a 503), send the headers, relay the rest
          (gateway.relay); a break after the first byte ends the stream with an OpenAI-shaped
          error event, never a retry
complete: POST, read the body, strip the telemetry the gateway asked for, send it

Each runs under one deadline, an `asyncio.timeout` scope: a stream's first token within
`first_byte_s`, then each read within `idle_stream_s` (gateway.stream_deadline); a complete answer
within `request_s`. A backend that stops stepping expires that scope early (gateway.attempt).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec

from backends.client import AnswerTooLarge, read_capped
from common.json_errors import JSON_DECODE_ERRORS
from common.usage import usage
from gateway.attempt import BUSY, NET_ERRORS, REQUEST_ERRORS, RETRYABLE, STALLED, Attempt, UpstreamFailure
from gateway.config import Config
from gateway.downstream import Downstream
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.openai_request import Kind
from gateway.pool import Backend
from gateway.relay import SseRelay, StreamRelay
from gateway.request import BACKEND_HEADER, REQUEST_ID_HEADER, TRACE_ID_HEADER, Request
from gateway.responses_relay import ResponsesRelay, read_response
from gateway.stream_deadline import StreamDeadline
from gateway.suspects import Suspects

__all__ = ["PATHS", "Exchange"]

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "responses": "/v1/responses"}
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class Exchange:
    def __init__(self, config: Config, metrics: GatewayMetrics, suspects: Suspects) -> None:
        self.metrics = metrics
        self.suspects = suspects
        self.configure(config)

    def configure(self, config: Config) -> None:
        """(Re)read the deadlines and limits; called again on reload."""
        t = config.timeouts
        self.first_byte_s = t.first_byte_s
        self.idle_stream_s = t.idle_stream_s
        self.request_s = t.request_s
        self.max_response_bytes = config.gateway.max_response_bytes
        # No socket-read timeout: the deadlines are the scopes above. Real SGLang sends a stream's
        # headers only with its first token, so the wait for them is the queue plus prefill.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s)

    async def stream(self, attempt: Attempt, client: Downstream) -> None:
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
            async with StreamDeadline(self.first_byte_s, self.idle_stream_s) as deadline:
                attempt.give_up_by(deadline.scope)
                resp = await attempt.post(PATHS[req.kind], upstream_body(req, backend), self._timeout)
                first = await _first_token(attempt, resp, relay)
                deadline.first_token()
                attempt.first_token()
                await client.start_stream(reply_headers(req, backend, stream=True), relay.failure_event)
                started, result.status = True, 200  # what the client saw, whatever follows
                attempt.give_up_by(deadline.scope)  # from here a stalled engine ends it, never retries it
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
            if attempt.abandoned:
                if not started:
                    raise attempt.stalled_failure() from None
                broken = STALLED
                self.suspects.failed_under(req.fingerprint, backend.name)
            elif not started:
                raise attempt.timed_out(f"sent no token within {self.first_byte_s:g}s") from None
            else:
                broken = f"upstream stream idle for more than {self.idle_stream_s:g}s"
        except NET_ERRORS as e:
            if not started:
                raise attempt.failure("broken_response", 502, f"failed while answering: {type(e).__name__}") from None
            broken = f"upstream stream broke: {type(e).__name__}"
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

    async def complete(self, attempt: Attempt, client: Downstream) -> None:
        req, backend = attempt.req, attempt.backend
        try:
            async with asyncio.timeout(self.request_s) as deadline:
                attempt.give_up_by(deadline)
                resp = await attempt.post(PATHS[req.kind], upstream_body(req, backend), self._timeout)
                try:
                    raw = await read_capped(resp, self.max_response_bytes)
                except AnswerTooLarge as e:  # the request's answer, not the backend's fault: no other is tried
                    raise ApiError(
                        502,
                        f"backend {backend.name} answered more than {e.limit} bytes (gateway.max_response_bytes)",
                        type="upstream_error",
                    ) from None
                except NET_ERRORS as e:
                    raise attempt.failure(
                        "broken_response", 502, f"failed while answering: {type(e).__name__}"
                    ) from None
        except TimeoutError:
            if attempt.abandoned:
                raise attempt.stalled_failure() from None
            raise attempt.timed_out(f"sent no whole answer within {self.request_s:g}s") from None
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
            await client.send_json(200, reply_headers(req, backend, stream=False), raw)
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
        await client.send_json(200, reply_headers(req, backend, stream=False), raw)


async def _first_token(attempt: Attempt, resp: aiohttp.ClientResponse, relay: StreamRelay) -> bytes:
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


def upstream_body(req: Request, backend: Backend) -> bytes:
    """The client's body with what this backend needs changed: its model name, the adapter, the
    telemetry the gateway asks for (spec details, a stream's usage)."""
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


def reply_headers(req: Request, backend: Backend, stream: bool) -> dict[str, str]:
    headers = {BACKEND_HEADER: backend.name, REQUEST_ID_HEADER: req.request_id}
    if req.span is not None and req.trace_id is not None:  # a recorded trace: the id finds it
        headers[TRACE_ID_HEADER] = req.trace_id
    if stream:
        headers["cache-control"] = "no-cache"
    return headers
