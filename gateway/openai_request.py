"""Validation of incoming OpenAI request bodies: only what routing needs; the rest passes through.

The body is decoded once (msgspec) into a dict so that unknown fields, SGLang extras included,
reach the upstream untouched.

SGLang validates its bodies with pydantic in lax mode (FastAPI's default): a JSON `"10"` or
`10.0` is the integer 10, `"0.5"` the number 0.5, `"true"` or `1` a boolean, `true` the integer 1.
The fields read here follow the same rules (pydantic itself decides, off the common path), so a
body SGLang takes is not refused by the gateway, and one SGLang would refuse is refused here, with
the field's name. The body still goes upstream as it came.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec
from pydantic import TypeAdapter, ValidationError

from common.json_errors import JSON_DECODE_ERRORS
from common.priority import priority_in_range
from gateway.adapters import requested_lora_paths
from gateway.errors import ApiError
from gateway.response_ids import check_response_id

Kind = Literal["chat", "completion", "responses"]
# Samples one request may ask for (`n`): OpenAI's documented maximum. SGLang has none.
MAX_N = 128
_decoder = msgspec.json.Decoder()
_LAX: dict[type, TypeAdapter[Any]] = {t: TypeAdapter(t) for t in (int, float, bool)}


class ParsedRequest(msgspec.Struct, kw_only=True):
    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    prompt_text: str
    max_tokens: int | None
    temperature: float | None  # as asked, when a number (the backend judges its range)
    client_wants_usage: bool
    client_wants_spec: bool
    # `chat_template_kwargs.thinking` (Kimi's switch; Qwen's is `enable_thinking`) when a boolean;
    # None leaves it to the server's default.
    thinking: bool | None = None
    tools: bool = False  # the request offers tools (a non-empty `tools` array)
    # Sequences SGLang generates for it: `n` per prompt, and a completions batch (an array of
    # strings or of token-id arrays) has one prompt per element. Usage and `sglext` sum over them.
    sequences: int = 1
    # Prompt tokens given as token ids (completions): counted exactly, not estimated from text.
    id_tokens: int = 0
    prompt_ids: list[int] | None = None  # the prompt, when it is one prompt of token ids
    lora_paths: frozenset[str] = frozenset()  # the LoRA adapters `lora_path` names (gateway.adapters)
    priority: int | None = None  # SGLang's `priority`: the request's place in the admission queue
    store: bool = True  # a Responses request's `store` (SGLang's default: true): its backend keeps it


def parse(raw: bytes, kind: Kind) -> ParsedRequest:
    if not raw.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        body = _decoder.decode(raw)
    except JSON_DECODE_ERRORS as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")

    model = _field(body, "model", str, required=True)
    if not model:
        raise ApiError(400, "'model' must not be empty", param="model")
    prompts, id_tokens, prompt_ids = 1, 0, None
    if kind == "chat":
        messages = _field(body, "messages", list, required=True)
        if not messages:
            raise ApiError(400, "'messages' must be a non-empty array", param="messages")
        prompt_text = _messages_text(messages)
    elif kind == "responses":
        prompt_text = _responses_text(body)
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise ApiError(400, "missing required field 'prompt'", param="prompt")
        if isinstance(prompt, str):
            prompt_text = prompt
        elif isinstance(prompt, list) and prompt:
            prompt_text = " ".join(p for p in prompt if isinstance(p, str))
            if all(type(t) is int for t in prompt):  # one prompt of token ids
                prompt_ids, id_tokens = prompt, len(prompt)
            elif all(isinstance(p, (str, list)) for p in prompt):  # a batch
                prompts = len(prompt)
                id_tokens = sum(len(p) for p in prompt if isinstance(p, list))
        else:
            raise ApiError(400, "'prompt' must be a string or a non-empty array", param="prompt")

    stream = _field(body, "stream", bool) or False
    if kind == "responses":
        limit = "max_output_tokens"
        max_tokens = _field(body, limit, int)
    else:
        limit = "max_completion_tokens"
        max_tokens = _field(body, limit, int) if kind == "chat" else None
        if not max_tokens:  # SGLang's `max_completion_tokens or max_tokens`: a 0 gives way too
            limit = "max_tokens"
            max_tokens = _field(body, limit, int)
    if max_tokens is not None and max_tokens < 0:
        raise ApiError(400, f"'{limit}' must be >= 0", param=limit)
    if max_tokens is not None and kind == "responses":
        max_tokens = max(0, max_tokens - 2)  # SGLang keeps 2 as headroom (ResponsesRequest.to_sampling_params)
    stream_options = _field(body, "stream_options", dict)
    if stream_options is not None and not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
    # A Responses stream always ends with its usage (`response.completed`): the client's, untouched.
    include_usage = stream_options.get("include_usage") if stream_options else None
    if include_usage is not None and type(include_usage) is not bool:
        include_usage = _lax("stream_options.include_usage", include_usage, bool)
    wants_usage = kind == "responses" or include_usage is True
    wants_spec = _field(body, "return_spec_tokens_details", bool) or False
    temperature = _number(body, "temperature", 0.0, math.inf, "must be >= 0")
    if "top_p" in body:
        _number(body, "top_p", 0.0, 1.0, "must be in (0, 1]", open_below=True)
    per_prompt = _sequences_per_prompt(body)
    if "tools" in body:
        _field(body, "tools", list)
    # At most 15 keyword arguments: CPython 3.11 compiles a call with more through a dict built for
    # it (STACK_USE_GUIDELINE), which measured +9k instructions a request. The rarer ones are set after.
    parsed = ParsedRequest(
        kind=kind,
        body=body,
        model=model,
        stream=stream,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        temperature=temperature,
        client_wants_usage=wants_usage,
        client_wants_spec=wants_spec,
        thinking=_thinking(body["chat_template_kwargs"]) if "chat_template_kwargs" in body else None,
        tools="tools" in body and isinstance(body["tools"], list) and bool(body["tools"]),
        sequences=prompts * per_prompt,
        id_tokens=id_tokens,
        prompt_ids=prompt_ids,
    )
    if "lora_path" in body:
        parsed.lora_paths = requested_lora_paths(body)
    if "priority" in body:
        parsed.priority = _priority(body)
    if kind == "responses":
        if body.get("store") is not None:
            parsed.store = _field(body, "store", bool)
        for name in ("previous_response_id", "request_id"):  # ids go into backend paths: checked first
            if body.get(name) is not None:
                check_response_id(body[name], name)
    return parsed


def _priority(body: dict[str, Any]) -> int | None:
    priority: int | None = _field(body, "priority", int)
    # refused here, it is never queued by a value no backend will take
    if priority is not None and not priority_in_range(priority):
        raise ApiError(400, "'priority' must be a signed 64-bit integer", param="priority")
    return priority


def _sequences_per_prompt(body: dict[str, Any]) -> int:
    """`n`, checked here because SGLang admits any count: one request asking for billions of
    samples would take a server's memory, and the gateway's retry would take the next one's."""
    n: int | None = _field(body, "n", int)
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"'n' must be an integer from 1 to {MAX_N}, got {n!r}"[:200], param="n")
    return n


def _number(
    body: dict[str, Any], name: str, low: float, high: float, rule: str, *, open_below: bool = False
) -> float | None:
    """A sampling parameter as a float, within SGLang's range (`SamplingParams.verify`): a bad
    one is refused here with its name rather than after a backend was chosen for it."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        value = _lax(name, value, float)
    if not (low < value <= high if open_below else low <= value <= high):
        raise ApiError(400, f"'{name}' {rule}, got {value!r}", param=name)
    return float(value)


def _thinking(kwargs: Any) -> bool | None:
    if not isinstance(kwargs, dict):
        return None
    for key in ("thinking", "enable_thinking"):
        if isinstance(kwargs.get(key), bool):
            value: bool = kwargs[key]
            return value
    return None


_TYPE_NAMES = {
    str: "a string",
    list: "an array",
    dict: "an object",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
}


def _field(body: dict[str, Any], name: str, typ: type, required: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"missing required field '{name}'", param=name)
        return None
    if type(value) is typ:
        return value
    if typ in _LAX:  # bool is a subclass of int, but `max_tokens: true` is 1 by pydantic's rules
        return _lax(name, value, typ)
    if not isinstance(value, typ):
        raise ApiError(400, f"'{name}' must be {_TYPE_NAMES[typ]}, got {type(value).__name__}", param=name)
    return value


def _lax(name: str, value: Any, typ: type) -> Any:
    """`value` as SGLang's pydantic models take it for a field of type `typ`, or the 400 for it."""
    try:
        return _LAX[typ].validate_python(value)
    except ValidationError:
        raise ApiError(
            400, f"'{name}' must be {_TYPE_NAMES[typ]}, got {type(value).__name__} {value!r}"[:200], param=name
        ) from None


def _responses_text(body: dict[str, Any]) -> str:
    """The text of a Responses request: its instructions, then its `input` (a string, or items
    whose text content counts: messages, and the outputs of earlier tool calls)."""
    instructions = _field(body, "instructions", str)
    value = body.get("input")
    if value is None:
        raise ApiError(400, "missing required field 'input'", param="input")
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and value:
        parts: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise ApiError(400, f"input[{i}] must be an object", param=f"input[{i}]")
            _add_text(parts, item.get("content", item.get("output")))
        text = "\n".join(parts)
    else:
        raise ApiError(400, "'input' must be a string or a non-empty array", param="input")
    return f"{instructions}\n{text}" if instructions else text


def _messages_text(messages: list[Any]) -> str:
    parts: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
        if not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}].role must be a string", param=f"messages[{i}].role")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            where = f"messages[{i}].content"
            raise ApiError(400, f"{where} must be a string or an array of content parts", param=where)
        _add_text(parts, m.get("content"))
    return "\n".join(parts)


def _add_text(parts: list[str], content: Any) -> None:
    """A message's or item's content: a string, or content parts, of which the text ones count."""
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
