"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, never a traceback."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response

from common.json_errors import JSON_DECODE_ERRORS

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """Raised anywhere in request handling; rendered by the app's exception handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: Any = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> Response[bytes]:
        return Response(self.body(), status_code=self.status, media_type="application/json", headers=self.headers)


# How much of a client's string an error message or a log line repeats: enough to recognise it,
# never the megabytes a client may send.
CLIP_CHARS = 80


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """`text` as an error message or a log line quotes it: repr'd, cut to `limit` characters."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"... ({len(text)} characters)"


def model_not_found(model: str, available: list[str]) -> ApiError:
    """A model this gateway does not serve: 404, as SGLang and OpenAI answer it."""
    return ApiError(
        404, f"model {clip(model)} does not exist; available: {available}", param="model", code="model_not_found"
    )


def error_body(message: str, type: str, param: str | None = None, code: Any = None) -> bytes:
    return msgspec.json.encode({"error": {"message": message, "type": type, "param": param, "code": code}})


def sse_error_event(message: str, type: str = "upstream_error", code: object = None) -> bytes:
    """What a client sees when a stream fails after its first byte: an error event, then [DONE]."""
    return b"data: " + error_body(message, type, None, code) + b"\n\ndata: [DONE]\n\n"


def translate_upstream_error(status: int, raw: bytes, backend: str) -> ApiError:
    """SGLang answers flat `{"object":"error","message",...}` (or `{"error": "..."}` on /generate);
    clients expect OpenAI's nested shape. The status is kept."""
    message, type_, param, code = f"upstream {backend} answered HTTP {status}", None, None, None
    try:
        data = msgspec.json.decode(raw)
    except JSON_DECODE_ERRORS:
        data = None
    if isinstance(data, dict):
        nested = data.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else data
        if isinstance(inner.get("message"), str):
            message = inner["message"]
        elif isinstance(nested, str):
            message = nested
        elif isinstance(data.get("detail"), str):
            message = data["detail"]
        type_ = inner.get("type") if isinstance(inner.get("type"), str) else None
        param = inner.get("param") if isinstance(inner.get("param"), str) else None
        code = inner.get("code")
    return ApiError(status, message, param=param, code=code if code is not None else status, type=type_)
