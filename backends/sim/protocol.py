"""Request bodies the twin accepts, validated at the boundary with msgspec.

Only the fields the twin acts on are typed; every other OpenAI or SGLang extra field
(`top_k`, `min_p`, `regex`, `chat_template_kwargs`, ...) is accepted and ignored, as SGLang
passes them to sampling the twin does not model. Defaults follow SGLang 0.5.23's protocol:
completions default to `max_tokens` 16; chat without `max_tokens`/`max_completion_tokens`
uses the native default of 128 new tokens (`SamplingParams.max_new_tokens`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from backends.sim.errors import ApiError

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "GenerateRequest",
    "StreamOptions",
    "CHAT_DEFAULT_MAX_TOKENS",
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "GENERATE_DEFAULT_MAX_NEW_TOKENS",
    "decode_body",
    "message_text",
]

CHAT_DEFAULT_MAX_TOKENS = 128
COMPLETION_DEFAULT_MAX_TOKENS = 16
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]] | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str = "default"
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    rid: str | None = None
    return_spec_tokens_details: bool = False


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    return_meta_info: bool = False

    @property
    def requested_max_tokens(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        if self.max_tokens is not None:
            return self.max_tokens
        return CHAT_DEFAULT_MAX_TOKENS


class CompletionRequest(_Common, kw_only=True):
    # str, list of one str, or token ids (list[int]); batches are refused by the server.
    prompt: str | list[Any]
    max_tokens: int = COMPLETION_DEFAULT_MAX_TOKENS

    @property
    def requested_max_tokens(self) -> int:
        return self.max_tokens


class GenerateRequest(msgspec.Struct, kw_only=True):
    """Native `/generate` body (single prompt)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = {}
    stream: bool = False
    rid: str | None = None


def message_text(msg: ChatMessage) -> str:
    """Text of a chat message; multimodal parts contribute their `text` fields only."""
    content = msg.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


async def decode_body(request: web.Request, typ: type) -> Any:
    """Parse a JSON body into `typ`; non-JSON content type, bad JSON or bad fields -> 400."""
    if request.content_type != "application/json":
        raise ApiError("Unsupported Media Type: Only 'application/json' is allowed")
    raw = await request.read()
    try:
        return msgspec.json.decode(raw, type=typ)
    except msgspec.ValidationError as e:
        param = None
        msg = str(e)
        if "at `$." in msg:
            param = msg.rsplit("at `$.", 1)[1].rstrip("`").split("[")[0].split(".")[0]
        elif "missing required field" in msg:
            param = msg.rsplit("`", 2)[-2]
        raise ApiError(f"1 validation error: {msg}", param=param) from None
    except msgspec.DecodeError as e:
        raise ApiError(f"JSON decode error: {e}") from None
