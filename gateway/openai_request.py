"""Validation of incoming OpenAI request bodies: only what routing needs; the rest passes through.

The body is decoded twice, both times by msgspec in C and leanly: once into a Struct of the fields
routing reads (messages as small Structs of role, text and tool calls: other fields are skipped
without being built), once into its top-level keys with their values as raw JSON, which is what
goes upstream (gateway.request_body). A body's memory is then about its own size, not the several
times its size a full decode into dicts and lists costs.

SGLang validates its bodies with pydantic in lax mode (FastAPI's default): a JSON `"10"` or
`10.0` is the integer 10, `"0.5"` the number 0.5, `"true"` or `1` a boolean, `true` the integer 1.
The fields read here follow the same rules (pydantic itself decides, off the common path), so a
body SGLang takes is not refused by the gateway, and one SGLang would refuse is refused here, with
the field's name. The body still goes upstream as it came.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Literal

import msgspec
from pydantic import TypeAdapter, ValidationError

from common.json_errors import JSON_DECODE_ERRORS
from common.priority import priority_in_range
from gateway.adapters import requested_lora_paths
from gateway.errors import ApiError
from gateway.request_body import RequestBody
from gateway.response_ids import check_response_id
from policies.prefix import BLOCK_TOKENS, MAX_BLOCKS, HistoryMessage

Kind = Literal["chat", "completion", "responses"]
# Samples one request may ask for (`n`): OpenAI's documented maximum. SGLang has none.
MAX_N = 128
_LAX: dict[type, TypeAdapter[Any]] = {t: TypeAdapter(t) for t in (int, float, bool)}


_NULL = msgspec.Raw(b"null")


class ContentPart(msgspec.Struct, gc=False):
    """A content part: its text, if it is a text part (image parts and others have none)."""

    text: Any = None


class Message(msgspec.Struct, gc=False):
    """A chat message as routing reads it (policies.prefix.HistoryMessage)."""

    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: Any = None


class InputItem(msgspec.Struct, gc=False):
    """A Responses input item: a message (role, content) or an earlier tool call's output."""

    role: Any = None
    content: Any = None
    output: Any = None
    tool_calls: Any = None  # never set by the API: items and messages render alike


class _Fields(msgspec.Struct, gc=False):
    """Every field routing reads, any kind; each as the client sent it (checked below), but the
    prompt's, which are read leanly."""

    model: Any = None
    messages: list[Message] | None = None
    input: str | list[InputItem] | None = None
    instructions: Any = None
    prompt: msgspec.Raw = msgspec.field(default_factory=lambda: _NULL)  # read by `_prompt`, leanly
    stream: Any = None
    max_tokens: Any = None
    max_completion_tokens: Any = None
    max_output_tokens: Any = None
    stream_options: Any = None
    return_spec_tokens_details: Any = None
    temperature: Any = None
    top_p: Any = None
    n: Any = None
    tools: msgspec.Raw = msgspec.field(default_factory=lambda: _NULL)  # any JSON: only its length is read
    chat_template_kwargs: Any = None
    lora_path: Any = None
    priority: Any = None
    store: Any = None
    background: Any = None
    previous_response_id: Any = None
    request_id: Any = None
    extra_key: Any = None
    cache_salt: Any = None


_fields_decoder = msgspec.json.Decoder(_Fields)
_top_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_length_decoder = msgspec.json.Decoder(list[msgspec.Raw])


class ParsedRequest(msgspec.Struct, kw_only=True):
    kind: Kind
    body: RequestBody  # what goes upstream
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
    prompt_ids: list[int] | None = None  # the prompt's first HEAD_IDS ids, when it is one prompt of token ids
    lora_paths: frozenset[str] = frozenset()  # the LoRA adapters `lora_path` names (gateway.adapters)
    priority: int | None = None  # SGLang's `priority`: the request's place in the admission queue
    store: bool = True  # a Responses request's `store` (SGLang's default: true): its backend keeps it
    background: bool = False  # a Responses request's `background`: answered at once, generated after
    # The message history routing reads: a chat's messages, or a Responses request's instructions
    # and input items (None: a prompt of text or token ids).
    history: list[HistoryMessage] | None = None
    stream_options: dict[str, Any] | None = None  # the client's, when streaming
    max_output_tokens: int | None = None  # a Responses request's, as asked
    previous_response_id: str | None = None
    request_id: str | None = None  # a Responses request's chosen id
    lora_path: Any = None  # as the client gave it, for the cache namespace
    extra_key: Any = None
    cache_salt: Any = None


def parse(raw: bytes, kind: Kind) -> ParsedRequest:
    if not raw.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        top = _top_decoder.decode(raw)
    except msgspec.ValidationError:
        raise ApiError(400, "request body must be a JSON object") from None
    except JSON_DECODE_ERRORS as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    try:
        f = _fields_decoder.decode(raw)
    except msgspec.ValidationError as e:
        raise _lean_error(e) from None
    except JSON_DECODE_ERRORS as e:  # cannot happen: the same bytes decoded above
        raise ApiError(400, f"request body is not valid JSON: {e}") from None

    model = _value(f.model, "model", str, required=True)
    if not model:
        raise ApiError(400, "'model' must not be empty", param="model")
    prompts, id_tokens, prompt_ids = 1, 0, None
    history: list[HistoryMessage] | None = None
    if kind == "chat":
        if f.messages is None:
            raise ApiError(400, "missing required field 'messages'", param="messages")
        if not f.messages:
            raise ApiError(400, "'messages' must be a non-empty array", param="messages")
        history = list(f.messages)
        prompt_text = "\n".join(_texts(m.content for m in f.messages))
    elif kind == "responses":
        instructions = _value(f.instructions, "instructions", str)
        prompt_text, history = _responses(f.input, instructions)
    else:
        prompt_text, prompts, id_tokens, prompt_ids = _prompt(f.prompt)

    stream = _value(f.stream, "stream", bool) or False
    max_output_tokens = None
    if kind == "responses":
        limit = "max_output_tokens"
        max_tokens = max_output_tokens = _value(f.max_output_tokens, limit, int)
    else:
        limit = "max_completion_tokens"
        max_tokens = _value(f.max_completion_tokens, limit, int) if kind == "chat" else None
        if not max_tokens:  # SGLang's `max_completion_tokens or max_tokens`: a 0 gives way too
            limit = "max_tokens"
            max_tokens = _value(f.max_tokens, limit, int)
    if max_tokens is not None and max_tokens < 0:
        raise ApiError(400, f"'{limit}' must be >= 0", param=limit)
    if max_tokens is not None and kind == "responses":
        max_tokens = max(0, max_tokens - 2)  # SGLang keeps 2 as headroom (ResponsesRequest.to_sampling_params)
    stream_options = _value(f.stream_options, "stream_options", dict)
    if stream_options is not None and not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
    # A Responses stream always ends with its usage (`response.completed`): the client's, untouched.
    include_usage = stream_options.get("include_usage") if stream_options else None
    if include_usage is not None and type(include_usage) is not bool:
        include_usage = _lax("stream_options.include_usage", include_usage, bool)
    wants_usage = kind == "responses" or include_usage is True
    wants_spec = _value(f.return_spec_tokens_details, "return_spec_tokens_details", bool) or False
    temperature = _number(f.temperature, "temperature", 0.0, math.inf, "must be >= 0")
    if f.top_p is not None:
        _number(f.top_p, "top_p", 0.0, 1.0, "must be in (0, 1]", open_below=True)
    # checked in this order: the first bad field is the one named
    thinking = _thinking(f.chat_template_kwargs) if f.chat_template_kwargs is not None else None
    tools = _offers_tools(f.tools)
    sequences = prompts * _sequences_per_prompt(f.n)
    lora_paths = requested_lora_paths(f.lora_path) if f.lora_path is not None else frozenset()
    priority = _priority(f.priority) if f.priority is not None else None
    store, background = True, False
    previous_response_id = request_id = None
    if kind == "responses":
        if f.store is not None:
            store = _value(f.store, "store", bool)
        if f.background is not None:
            background = _value(f.background, "background", bool)
        # ids go into backend paths: their shape is checked before anything else reads them
        if f.previous_response_id is not None:
            previous_response_id = check_response_id(f.previous_response_id, "previous_response_id")
        if f.request_id is not None:
            request_id = check_response_id(f.request_id, "request_id")
    return ParsedRequest(
        kind=kind,
        body=RequestBody(top),
        model=model,
        stream=stream,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        temperature=temperature,
        client_wants_usage=wants_usage,
        client_wants_spec=wants_spec,
        thinking=thinking,
        tools=tools,
        sequences=sequences,
        id_tokens=id_tokens,
        prompt_ids=prompt_ids,
        lora_paths=lora_paths,
        priority=priority,
        store=store,
        background=background,
        history=history,
        stream_options=stream_options,
        max_output_tokens=max_output_tokens,
        previous_response_id=previous_response_id,
        request_id=request_id,
        lora_path=f.lora_path,
        extra_key=f.extra_key,
        cache_salt=f.cache_salt,
    )


# Token ids of a prompt that routing reads: its prefix chain's (policies.prefix.token_blocks).
HEAD_IDS = MAX_BLOCKS * BLOCK_TOKENS
_NOT_IDS = b"0123456789,-+ \t\r\n"  # what a JSON array of integers is made of, but its brackets
_COMMA = re.compile(rb",")


def _prompt(raw: msgspec.Raw) -> tuple[str, int, int, list[int] | None]:
    """A completions prompt: (its text, prompts in it, token ids in it, the first `HEAD_IDS` ids of
    a single prompt of ids). One prompt of token ids is counted on its bytes, not decoded whole:
    decoded, each id is a Python int of 28 bytes or more for its 2-7 bytes of JSON."""
    data = bytes(raw)
    if data[:1] == b"[" and data.translate(None, _NOT_IDS) == b"[]" and data.strip(b"[] \t\r\n"):
        # the body is valid JSON already: brackets around digits, signs and commas are integers
        count = data.count(b",") + 1
        if count > HEAD_IDS:
            cut = next(itertools.islice(_COMMA.finditer(data), HEAD_IDS - 1, None)).start()
            data = data[:cut] + b"]"
        try:
            head: list[int] = msgspec.json.decode(data, type=list[int])
        except msgspec.ValidationError:
            raise ApiError(
                400, "'prompt' must be a string or an array of strings or token ids", param="prompt"
            ) from None
        return "", 1, count, head
    prompt = msgspec.json.decode(data)
    if prompt is None:
        raise ApiError(400, "missing required field 'prompt'", param="prompt")
    if isinstance(prompt, str):
        return prompt, 1, 0, None
    if isinstance(prompt, list) and prompt:
        text = " ".join(p for p in prompt if isinstance(p, str))
        if all(isinstance(p, (str, list)) for p in prompt):  # a batch
            return text, len(prompt), sum(len(p) for p in prompt if isinstance(p, list)), None
        return text, 1, 0, None
    raise ApiError(400, "'prompt' must be a string or a non-empty array", param="prompt")


def _responses(
    value: str | list[InputItem] | None, instructions: str | None
) -> tuple[str, list[HistoryMessage] | None]:
    """A Responses request's text (its instructions, then its `input`: a string, or items whose
    text content counts: messages, and the outputs of earlier tool calls) and its history (the
    items, instructions first as SGLang renders them: the system message; None for a string)."""
    if value is None:
        raise ApiError(400, "missing required field 'input'", param="input")
    history: list[HistoryMessage] | None = None
    if isinstance(value, str):
        text = value
    elif value:
        text = "\n".join(_texts(item.content if item.content is not None else item.output for item in value))
        system = [InputItem(role="system", content=instructions)] if instructions is not None else []
        history = [*system, *value]
    else:
        raise ApiError(400, "'input' must be a string or a non-empty array", param="input")
    return (f"{instructions}\n{text}" if instructions else text), history


def _texts(contents: Any) -> list[str]:
    """The text of each content: a string, or content parts (Structs, or an item's plain objects)
    whose text ones count."""
    parts: list[str] = []
    for content in contents:
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for p in content:
                text = p.text if isinstance(p, ContentPart) else p.get("text") if isinstance(p, dict) else None
                if isinstance(text, str):
                    parts.append(text)
    return parts


def _offers_tools(tools: msgspec.Raw) -> bool:
    """A non-empty `tools` array (absent or null: none); anything else is refused by name."""
    if tools is _NULL:  # absent
        return False
    try:
        return bool(_length_decoder.decode(tools))
    except msgspec.ValidationError:
        if bytes(tools).strip() == b"null":
            return False
        raise ApiError(400, "'tools' must be an array", param="tools") from None


def _priority(value: Any) -> int | None:
    priority: int | None = _value(value, "priority", int)
    # refused here, it is never queued by a value no backend will take
    if priority is not None and not priority_in_range(priority):
        raise ApiError(400, "'priority' must be a signed 64-bit integer", param="priority")
    return priority


def _sequences_per_prompt(value: Any) -> int:
    """`n`, checked here because SGLang admits any count: one request asking for billions of
    samples would take a server's memory, and the gateway's retry would take the next one's."""
    n: int | None = _value(value, "n", int)
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"'n' must be an integer from 1 to {MAX_N}, got {n!r}"[:200], param="n")
    return n


def _number(value: Any, name: str, low: float, high: float, rule: str, *, open_below: bool = False) -> float | None:
    """A sampling parameter as a float, within SGLang's range (`SamplingParams.verify`): a bad
    one is refused here with its name rather than after a backend was chosen for it."""
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


def _value(value: Any, name: str, typ: type, required: bool = False) -> Any:
    """A field's value checked for `typ` (None: absent or null), by SGLang's lax rules for scalars."""
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


# What a field the lean decode types must be, by the last part of its path.
_EXPECTED = {
    "messages": "a non-empty array of message objects",
    "input": "a string or a non-empty array of input items",
    "content": "a string or an array of content parts",
    "role": "a string",
}
_AT = re.compile(r" - at `\$\.?(.*)`$")


def _lean_error(error: msgspec.ValidationError) -> ApiError:
    """A message or item of the wrong shape, named by its path (`messages[0].content`), as the
    fields of the message's own rules say it."""
    text = str(error)
    found = _AT.search(text)
    path = found.group(1) if found else ""
    missing = re.match(r"Object missing required field `(\w+)`", text)
    if missing:
        path = f"{path}.{missing.group(1)}"
    leaf = re.sub(r"\[\d+\]$", "", path.rsplit(".", 1)[-1])
    expected = _EXPECTED.get(leaf) if not re.search(r"\[\d+\]$", path) else "an object"
    if expected is None:
        expected = "an object" if leaf in ("messages", "input") else "of another type"
    got = re.match(r"Expected `[^`]*`, got `(\w+)`", text)
    suffix = f", got {got.group(1)}" if got else ""
    return ApiError(400, f"{path or 'body'} must be {expected}{suffix}", param=path or None)
