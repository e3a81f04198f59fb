"""Request bodies the twin accepts, validated at the boundary with msgspec.

Only the fields the twin acts on are typed; every other OpenAI or SGLang extra field
(`top_k`, `min_p`, `regex`, ...) is accepted and ignored, as SGLang passes them to sampling the
twin does not model. `tools` and `tool_choice` stay untyped here: tools.py validates them the
way SGLang's pydantic models do, so that errors carry SGLang's messages. `chat_template_kwargs`
is any JSON object; the twin reads `thinking` from it and ignores every other key. Completions
default to `max_tokens` 16, as SGLang 0.5.23's protocol does. Chat without
`max_tokens`/`max_completion_tokens` gets no budget (`ChatCompletionRequest.to_sampling_params`:
`max_new_tokens` None): the scheduler's clamp, and the answer ends at its EOS
(`generation.unbounded_budget`, answers.py). `priority` stays untyped here and is checked by
`request_priority` as pydantic checks SGLang's `Optional[int]` (lax: "5", true and 5.0 are
integers), with FastAPI's error text.
"""

from __future__ import annotations

import contextlib
import json
import types
import typing
from typing import Any, Literal

import msgspec
from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from common.json_errors import JSON_DECODE_ERRORS
from twin.errors import ApiError
from twin.tools import fastapi_message

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "GenerateRequest",
    "ResponsesReasoning",
    "ResponsesRequest",
    "StreamOptions",
    "CHAT_DEFAULT_MAX_TOKENS",
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "COMPLETIONS_ENDPOINT",
    "GENERATE_ENDPOINT",
    "GENERATE_DEFAULT_MAX_NEW_TOKENS",
    "decode_body",
    "history_tool_calls",
    "message_text",
    "request_priority",
]

CHAT_DEFAULT_MAX_TOKENS = 128
COMPLETION_DEFAULT_MAX_TOKENS = 16
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128
# The route lines of FastAPI's validation text (`http_server.py`). FastAPI prints the first line of
# the route's source (`fastapi/routing.py: _extract_endpoint_context`, `inspect.getsourcelines`):
# its decorator, not its `def`.
COMPLETIONS_ENDPOINT = (
    '  File "sglang/srt/entrypoints/http_server.py", line 1860, in openai_v1_completions\n    POST /v1/completions'
)
GENERATE_ENDPOINT = '  File "sglang/srt/entrypoints/http_server.py", line 928, in generate_request\n    POST /generate'


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = False  # Optional[bool] in SGLang's protocol.py
    continuous_usage_stats: bool | None = False


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


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
    # the adapter(s) by name; a "served:adapter" `model` takes precedence (lora.py)
    lora_path: str | list[str | None] | None = None
    priority: Any = None  # Optional[int], checked by request_priority


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    return_meta_info: bool = False
    tools: Any = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    reasoning_effort: str | float | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        """The client's budget; None when it sets none (`generation.unbounded_budget`). As
        `to_sampling_params` reads it: `max_completion_tokens or max_tokens`, so a 0 gives way."""
        return self.max_completion_tokens or self.max_tokens


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
    lora_path: str | list[str | None] | None = None  # the adapter(s) by name (lora.py)
    priority: Any = None  # Optional[int] (io_struct.py), checked by request_priority


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]
_INCLUDES = Literal[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
]


class ResponsesReasoning(msgspec.Struct, kw_only=True):
    """`protocol.py: ResponseReasoningParam` (`effort` defaults to "medium" once given)."""

    effort: ReasoningEffort | None = "medium"
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """`/v1/responses` body, the fields of `protocol.py: ResponsesRequest` the twin acts on or
    echoes (defaults as there: `store` true, `stream`/`background` false). `input` is a string or
    a list of item objects; `tools` stay untyped (responses_api.py checks their `type`); the
    sampling extras (`top_k`, `stop`, penalties, ...) are accepted and ignored."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    store: bool | None = True
    background: bool | None = False
    previous_response_id: str | None = None
    reasoning: ResponsesReasoning | None = None
    include: list[_INCLUDES] | None = None
    metadata: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    tool_choice: Literal["auto", "required", "none"] | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    user: str | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = 0
    chat_template_kwargs: dict[str, Any] | None = None
    request_id: str | None = None  # SGLang's default: f"resp_{uuid4().hex}"
    priority: Any = 0  # `int = 0`, checked by request_priority; SGLang does not forward it


_OPTIONAL_INT: TypeAdapter[int | None] = TypeAdapter(int | None)
_INT: TypeAdapter[int] = TypeAdapter(int)


def request_priority(value: Any, endpoint: str, optional: bool = True) -> int | None:
    """The `priority` field as FastAPI's pydantic validation reads it: `Optional[int]` on chat,
    completions and /generate (`entrypoints/openai/protocol.py`, `managers/io_struct.py`), `int`
    on /v1/responses. Lax, as FastAPI validates the parsed JSON: "5", true and 5.0 are accepted;
    "high", 1.5 or a list are a 400 `type` "Bad Request" in FastAPI's words (`endpoint` is the
    route's line of the message, tools.fastapi_message)."""
    try:
        return _OPTIONAL_INT.validate_python(value) if optional else _INT.validate_python(value)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", "priority", *err["loc"])} for err in e.errors(include_url=False)]
        raise ApiError(fastapi_message(errors, endpoint), err_type="Bad Request") from None


def history_tool_calls(messages: list[ChatMessage]) -> int:
    """Tool calls already made in the conversation (Kimi-K2 numbers call ids by it)."""
    return sum(len(m.tool_calls or []) for m in messages if m.role == "assistant")


def message_text(msg: ChatMessage) -> str:
    """Text of a chat message; multimodal parts contribute their `text` fields only."""
    content = msg.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


async def decode_body(request: web.Request, typ: type, *, strict: bool = False) -> Any:
    """Parse a JSON body into `typ`; non-JSON content type, bad JSON or bad fields -> 400.

    Errors are SGLang's request-schema errors: FastAPI's handler turns them into a flat body with
    `type: "Bad Request"` and `param: null`. Bad JSON is reported as FastAPI reports it (a
    `json_invalid` error at the byte offset); field errors carry msgspec's description.

    Numbers and booleans are converted as FastAPI's pydantic models convert them, in lax mode:
    `"10"` and `10.0` are 10, `"0.5"` is 0.5, `"true"`, `"yes"` and `1` are true, `true` is 1
    (`_lax`: pydantic itself decides). `strict`: JSON's own types only, as `/generate`'s JSON
    contract has them (`entrypoints/api_contract.py`, checked after pydantic's parse).
    """
    if request.content_type != "application/json":
        raise ApiError("Unsupported Media Type: Only 'application/json' is allowed", err_type="Bad Request")
    raw = await request.read()
    try:
        if strict:
            return msgspec.json.decode(raw, type=typ)
        return msgspec.convert(_lax(msgspec.json.decode(raw), typ), typ)
    except msgspec.ValidationError as e:
        raise ApiError(f"1 validation error:\n  {e}", err_type="Bad Request") from None
    except JSON_DECODE_ERRORS:
        raise ApiError(_json_error_message(raw), err_type="Bad Request") from None


# Per request type: its number and boolean fields, each with pydantic's validator for its type and
# the types that need no conversion; and its fields that are request types themselves.
_Scalars = list[tuple[str, TypeAdapter[Any], tuple[type, ...]]]
_LAX_FIELDS: dict[type, tuple[_Scalars, list[tuple[str, type]]]] = {}
_SCALARS = (int, float, bool)


def _lax_fields(typ: type) -> tuple[_Scalars, list[tuple[str, type]]]:
    fields = _LAX_FIELDS.get(typ)
    if fields is None:
        scalars: _Scalars = []
        nested: list[tuple[str, type]] = []
        for f in msgspec.structs.fields(typ):
            args = typing.get_args(f.type) if isinstance(f.type, types.UnionType) else (f.type,)
            if any(a in _SCALARS for a in args) and all(a in _SCALARS or a is type(None) for a in args):
                scalars.append((f.encode_name, TypeAdapter(f.type), args))
            for a in args:
                if isinstance(a, type) and issubclass(a, msgspec.Struct):
                    nested.append((f.encode_name, a))
        fields = _LAX_FIELDS[typ] = (scalars, nested)
    return fields


def _lax(data: Any, typ: type) -> Any:
    """`data` with its number and boolean fields converted as pydantic converts them; a value
    pydantic refuses is left for msgspec to refuse, with its own message."""
    if not isinstance(data, dict):
        return data
    scalars, nested = _lax_fields(typ)
    for name, adapter, exact in scalars:
        if name in data and type(data[name]) not in exact:
            with contextlib.suppress(ValidationError):
                data[name] = adapter.validate_python(data[name])
    for name, inner in nested:
        if name in data:
            data[name] = _lax(data[name], inner)
    return data


def _json_error_message(raw: bytes) -> str:
    try:
        json.loads(raw)
        pos, why = 0, "Invalid JSON"
    except json.JSONDecodeError as e:
        pos, why = e.pos, e.msg
    except UnicodeDecodeError:
        pos, why = 0, "Invalid UTF-8"
    err = {"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error", "input": {}, "ctx": {"error": why}}
    return f"1 validation error:\n  {err} [{err}]"
