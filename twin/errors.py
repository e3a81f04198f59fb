"""SGLang's error bodies, so the gateway's translation is tested against the real shapes.

OpenAI routes answer FLAT bodies `{"object":"error","message","type","param","code"}` with the
HTTP status (validation is 400, not 422); native routes answer `{"error": "<text>"}`; errors after
a stream started arrive as `data: {"error": {...}}` then `data: [DONE]` (chunks.py).
"""

from __future__ import annotations

import msgspec
from aiohttp import web

__all__ = [
    "ApiError",
    "SchedulerAbort",
    "TokenizerError",
    "flat_error",
    "native_error",
    "native_value_error",
    "native_stream_error",
    "responses_error",
]

_PHRASE = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    """Raised by request handling; rendered by the route in the route family's shape."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        # SGLang's `type` depends on where the error was raised: "BadRequestError" from a
        # serving handler, "Bad Request" from the request-schema (pydantic) handler, the bare
        # status ("503") from an HTTPException.
        self.err_type = err_type or _PHRASE.get(status, "BadRequestError")


class SchedulerAbort(ApiError):
    """A request SGLang's scheduler aborted with status 503 (`scheduler.py: _make_abort_req`): the
    full queue, a priority the server refuses, eviction by a higher priority. The abort reaches
    the tokenizer manager as a finished output; `_handle_abort_finish_reason` raises
    HTTPException(503) when not streamed (flat body, `type` "503", `http_server.py`) and hands a
    stream the output, which the OpenAI routes turn into an error frame (`serving_chat.py`,
    `serving_completions.py`). `rid` is the request's (the stream's chunk id)."""

    def __init__(self, message: str, rid: str = "") -> None:
        super().__init__(message, status=503, err_type="503")
        self.rid = rid


class TokenizerError(ApiError):
    """A ValueError raised by SGLang's tokenizer manager once the request reached it (LoRA
    resolution). OpenAI routes answer it with `create_error_response(str(e))`: 400, flat body,
    `type` "BadRequestError", before any SSE byte (`serving_chat.py`, `serving_completions.py`);
    native `/generate` as `serve_generate_request` does (`native_value_error`, `native_stream_error`)."""


def _body(err: ApiError) -> dict[str, object]:
    return {"object": "error", "message": err.message, "type": err.err_type, "param": err.param, "code": err.status}


def flat_error(err: ApiError) -> web.Response:
    """OpenAI-route error response in SGLang's flat shape."""
    return web.Response(status=err.status, body=msgspec.json.encode(_body(err)), content_type="application/json")


def responses_error(err: ApiError) -> web.Response:
    """`/v1/responses*` errors, nested: `{"error": {"message", "type", "param", "code"}}` with the
    HTTP status as `code` (`serving_responses.create_error_response`, whose default `type` is
    "invalid_request_error"; and `http_server.py`'s handlers for paths under `/v1/responses`:
    schema errors 400 `type` "Bad Request", HTTPExceptions `type` the status phrase)."""
    body = {"error": {"message": err.message, "type": err.err_type, "param": err.param, "code": err.status}}
    return web.Response(status=err.status, body=msgspec.json.encode(body), content_type="application/json")


def native_error(err: ApiError) -> web.Response:
    """Native-route (`/generate`) error response: `{"error": "<text>"}`."""
    return web.Response(
        status=err.status, body=msgspec.json.encode({"error": err.message}), content_type="application/json"
    )


def native_value_error(err: ApiError) -> web.Response:
    """`/generate`, not streamed, on a tokenizer-manager ValueError: 400 `{"error": {"message": ...}}`
    (`entrypoints/http_server.py: _create_error_response`)."""
    body = msgspec.json.encode({"error": {"message": err.message}})
    return web.Response(status=err.status, body=body, content_type="application/json")


def native_stream_error(err: ApiError) -> bytes:
    """`/generate`, streamed, on a tokenizer-manager ValueError: after HTTP 200, one error frame then
    `[DONE]` (`entrypoints/http_server.py: serve_generate_request.stream_results`)."""
    error = {"message": err.message, "type": "invalid_request_error", "code": err.status, "retryable": False}
    return b"data: " + msgspec.json.encode({"error": error}) + b"\n\ndata: [DONE]\n\n"
