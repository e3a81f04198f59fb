"""Native SGLang routes: `/generate` (with `meta_info`), `/abort_request`, `/metrics`.

`/generate` streams are cumulative by default (each chunk carries all text and ids so far);
`--incremental-streaming-output` switches them to deltas, as in SGLang. Telemetry fallbacks of
the gateway for older servers read `meta_info` from here. A request the scheduler aborts with
status 503 (the queue full, a priority refused, eviction by a higher priority) gets, not streamed,
the HTTPException's flat 503 (`type` "503", `http_server.py`'s handler); streamed, HTTP 200, the
abort's output (`meta_info.finish_reason` with `status_code` 503) and `[DONE]`
(`tokenizer_manager.py: _handle_abort_req, _handle_abort_finish_reason`).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from common.json_errors import JSON_DECODE_ERRORS
from twin.answers import natural_stop
from twin.chunks import SSE_HEADERS
from twin.domain import classify, prompt_key
from twin.errors import (
    ApiError,
    SchedulerAbort,
    flat_error,
    native_error,
    native_stream_error,
    native_value_error,
)
from twin.generation import admit, sampling_values
from twin.protocol import (
    GENERATE_DEFAULT_MAX_NEW_TOKENS,
    GENERATE_ENDPOINT,
    GenerateRequest,
    decode_body,
    request_priority,
)
from twin.state import STATE_KEY
from twin.text import count_prompt_tokens, detokenize

__all__ = ["routes"]

_encode = msgspec.json.Encoder().encode


def _prompt(body: GenerateRequest) -> tuple[str, int]:
    if (body.text is None) == (body.input_ids is None):
        raise ApiError("Either text or input_ids should be provided.")
    if body.text is not None:
        return body.text, count_prompt_tokens(body.text)
    ids = body.input_ids or []
    if not ids:
        raise ApiError("input_ids must not be empty")
    return " ".join(map(str, ids)), len(ids)


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ApiError(f"{name} must be a number, got {value!r}")
    return float(value)


def _ignore_eos(params: dict[str, Any]) -> bool:
    """`sampling_params.ignore_eos`, false when unset: the model ends its answer by itself. The
    JSON contract wants a boolean (`api/v1/api_types.py`), serde's error otherwise."""
    value = params.get("ignore_eos")
    if value is not None and not isinstance(value, bool):
        raise ApiError(f"invalid type: {_unexpected(value)}, expected a boolean")
    return value is True


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display, as `api/v1/api_types.py: _unexpected` writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def _priority(value: Any) -> int | None:
    """`priority`, checked twice as SGLang checks a /generate body: FastAPI's pydantic parse of the
    `GenerateReqInput` dataclass (lax `Optional[int]`: a flat 400 "Bad Request"), then the JSON
    contract (`api/v1/api_types.py: decode_GenerateRequest`, `_expect_int(x, "i64")`: an integer,
    not "5", true or 5.0, which pydantic let through: `{"error": "invalid type: ..."}`)."""
    priority = request_priority(value, GENERATE_ENDPOINT)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ApiError(f"invalid type: {_unexpected(value)}, expected i64")
    return priority


def _abort_output(e: SchedulerAbort, e2e_latency: float, ids: list[int], incremental: bool) -> bytes:
    """The streamed output of a scheduler abort, then `[DONE]` (`tokenizer_manager.py:
    _handle_abort_req`, `_wait_one_response`): the text so far, the ids (the last one only when
    incremental), the abort's meta_info in SGLang's key order."""
    meta = {
        "id": e.rid,
        "finish_reason": {"type": "abort", "status_code": 503, "message": e.message},
        "weight_version": "default",
        "e2e_latency": e2e_latency,
        "completion_tokens": len(ids),
        "response_sent_to_client_ts": time.time(),
    }
    out = {"text": detokenize(ids), "output_ids": ids[-1:] if incremental else ids, "meta_info": meta}
    return b"data: " + _encode(out) + b"\n\ndata: [DONE]\n\n"


def _max_new_tokens(params: dict[str, Any]) -> int:
    value = params.get("max_new_tokens", GENERATE_DEFAULT_MAX_NEW_TOKENS)
    if value is None:
        return GENERATE_DEFAULT_MAX_NEW_TOKENS
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(f"max_new_tokens must be an integer, got {value!r}")
    return value


async def generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:  # the request contract: `generate_contract_error` answers `{"error": "<text>"}`
        body: GenerateRequest = await decode_body(request, GenerateRequest, strict=True)
        priority = _priority(body.priority)
        text, ntok = _prompt(body)
        params = body.sampling_params
        max_new_tokens = _max_new_tokens(params)
        ignore_eos = _ignore_eos(params)
    except ApiError as e:
        # schema errors (bad JSON, wrong field types) come from FastAPI's handler: flat shape
        return flat_error(e) if e.err_type == "Bad Request" else native_error(e)
    try:
        # SamplingParams: temperature 1.0 and top_p 1.0 when unset
        temperature, top_p = sampling_values(state, _number(params, "temperature", 1.0), _number(params, "top_p", 1.0))
        domain, key = classify(text), prompt_key(text)
        gen = await admit(
            state,
            body.rid,
            text,
            ntok,
            max_new_tokens,
            domain=domain,
            key=key,
            stop_after_tokens=natural_stop(state.profile.answer, domain, key, ignore_eos=ignore_eos),
            temperature=temperature,
            top_p=top_p,
            lora=body.lora_path,
            priority=priority,
        )
    except SchedulerAbort as e:
        if not body.stream:
            return flat_error(e)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(_abort_output(e, 0.0, [], state.options.incremental_streaming_output))
        await resp.write_eof()
        return resp
    except ApiError as e:
        if e.status != 400:  # a fault knob's 5xx: not the tokenizer manager's
            return native_error(e)
        # A ValueError of the tokenizer manager (LoRA, SamplingParams.verify, the context length):
        # `serve_generate_request`'s ValueError paths.
        if not body.stream:
            return native_value_error(e)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(native_stream_error(e))
        await resp.write_eof()
        return resp
    try:
        if not body.stream:
            ids: list[int] = []
            async for n in gen.steps():
                ids.extend(gen.tokens.take_ids(n))
            if gen.abort_error is not None:  # `_handle_abort_finish_reason`: HTTPException(503)
                return flat_error(gen.abort_error)
            gen.cache_output(detokenize(ids))
            return web.Response(
                body=_encode({"text": detokenize(ids), "output_ids": ids, "meta_info": gen.meta_info(finished=True)}),
                content_type="application/json",
            )
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        incremental = state.options.incremental_streaming_output
        all_ids: list[int] = []
        try:
            final_ids: list[int] = []
            async for n in gen.steps():
                ids = gen.tokens.take_ids(n)
                all_ids.extend(ids)
                if gen.finish_reason is None:
                    meta = gen.meta_info(False, completion_tokens=len(all_ids))
                    await resp.write(_chunk(ids, all_ids, incremental, meta))
                else:  # the last step's tokens travel with the finished meta_info
                    final_ids = ids
            if gen.abort_error is not None:
                e2e = (time.perf_counter() - gen.t_start) / (state.runtime.time_scale or 1.0)
                await resp.write(_abort_output(gen.abort_error, e2e, all_ids, incremental))
                await resp.write_eof()
                return resp
            await resp.write(_chunk(final_ids, all_ids, incremental, gen.meta_info(True)) + b"data: [DONE]\n\n")
            await resp.write_eof()
            gen.cache_output(detokenize(all_ids))
        except ConnectionResetError:
            state.runtime.abort(gen.rid)
        return resp
    finally:
        gen.release()


def _chunk(new_ids: list[int], all_ids: list[int], incremental: bool, meta: dict[str, Any]) -> bytes:
    ids = new_ids if incremental else list(all_ids)
    obj = {"text": detokenize(ids), "output_ids": ids, "meta_info": meta, "index": 0}
    return b"data: " + _encode(obj) + b"\n\n"


async def abort_request(request: web.Request) -> web.Response:
    """`POST /abort_request {"rid": ..., "abort_all": false}`: 200 whether or not rid existed."""
    state = request.app[STATE_KEY]
    try:
        body = msgspec.json.decode(await request.read() or b"{}", type=dict)
    except JSON_DECODE_ERRORS:
        return native_error(ApiError("JSON decode error"))
    if body.get("abort_all"):
        for rid in list(state.runtime.in_flight()):
            state.runtime.abort(rid)
    elif isinstance(body.get("rid"), str):
        state.runtime.abort(body["rid"])
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if state.metrics is None:
        raise web.HTTPNotFound()
    text = state.metrics.render(state.engine.stats(), state.profile.is_speculative)
    return web.Response(
        text=text, content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"}
    )


def routes() -> list[web.RouteDef]:
    return [web.post("/generate", generate), web.post("/abort_request", abort_request), web.get("/metrics", metrics)]
