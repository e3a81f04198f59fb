"""Tool calling in the twin: request validation as SGLang 0.5.23 does it, the decision to call a
tool, and the Kimi-K2 markup the model emits for a call.

Validation has two layers, as in SGLang:
- the request schema (`entrypoints/openai/protocol.py`: `Tool`, `Function`, `ToolChoice`), checked
  by pydantic, rejected by FastAPI's handler with a 400 whose message is FastAPI's
  `RequestValidationError` text (`http_server.py`); the twin validates `tools`/`tool_choice` with
  pydantic models of the same field types so that the error list is the one SGLang prints;
- `serving_chat._validate_request`: `tool_choice` "required" or a named tool without tools, a named
  tool missing from the list, and each tool's `parameters` checked as a JSON Schema (2020-12).

Whether the model calls a tool is the twin's own rule (an assumption): with `tool_choice`
"required" or a named function it always calls; with "auto" it calls when the last message is a
user turn that names a tool (a word of the tool's name, e.g. "weather" for `get_weather`) or asks
for a tool outright ("use the tool", "call ..."). After a tool result it answers in text. One call
per turn. Arguments are built from the tool's JSON Schema: required properties (all properties if
none are required), strings taken from the user's words where the property name suggests it.

Kimi-K2 markup (`function_call/kimik2_detector.py`): `<|tool_calls_section_begin|>
<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{json}<|tool_call_end|>
<|tool_calls_section_end|>`; the call id is `functions.{name}:{index}` with the index counting
the tool calls already in the conversation (`serving_chat._process_tool_call_id`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import msgspec
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs installed
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]  # no stubs installed
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

__all__ = [
    "SECTION_BEGIN",
    "SECTION_END",
    "CALL_BEGIN",
    "CALL_END",
    "ARG_BEGIN",
    "CHAT_ENDPOINT",
    "PlannedCall",
    "ToolError",
    "call_pieces",
    "plan_call",
    "validate_tools",
]

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
_PIECE_CHARS = 4  # one generated token per ~4 characters of plain text (text.py's rule)


class ToolError(Exception):
    """A request SGLang rejects. `schema` errors are FastAPI's (type "Bad Request"), others
    come from `_validate_request` (type "BadRequestError")."""

    def __init__(self, message: str, schema: bool) -> None:
        super().__init__(message)
        self.message = message
        self.schema = schema


# ----------------------------------------------------------------- schema (pydantic) layer
# The class names are SGLang's: pydantic tags union errors with the member's class name
# ("ToolChoice"), and that tag is part of the error text a client sees.


class Function(BaseModel):
    description: str | None = Field(default=None)
    name: str
    parameters: object | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    key_order: list[str] = Field(default_factory=list, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _key_order(cls, data: Any) -> Any:
        # SGLang records the client's key order before validation; the recorded list is part
        # of the `input` its validation errors echo, so the twin records it too.
        if isinstance(data, dict):
            data = dict(data)
            data["key_order"] = list(data.keys())
        return data


class Tool(BaseModel):
    type: str = Field(default="function")
    function: Function
    defer_loading: bool | None = None


class ToolChoiceFuncName(BaseModel):
    name: str | None = None


class ToolChoice(BaseModel):
    function: ToolChoiceFuncName
    type: Literal["function"] = Field(default="function")


_TOOLS = TypeAdapter(list[Tool] | None)
_CHOICE = TypeAdapter(ToolChoice | Literal["auto", "required", "none"])
# FastAPI's RequestValidationError names the route's function and its decorator's line (`http_server.py`)
CHAT_ENDPOINT = (
    '  File "sglang/srt/entrypoints/http_server.py", line 1870, in '
    "openai_v1_chat_completions\n    POST /v1/chat/completions"
)


def fastapi_message(errors: list[dict[str, Any]], endpoint: str = CHAT_ENDPOINT) -> str:
    """FastAPI's RequestValidationError text followed by its error list, as SGLang's handler
    joins them (`f"{exc} {exc.errors()}"`). The endpoint line names SGLang's route; the real
    server prints its own install path there."""
    n = len(errors)
    head = f"{n} validation error{'s' if n != 1 else ''}:\n"
    body = "".join(f"  {e}\n" for e in errors)
    return f"{head}{body}{endpoint}".rstrip() + f" {errors}"


def _errors(exc: ValidationError, prefix: tuple[Any, ...]) -> list[dict[str, Any]]:
    """pydantic's errors as FastAPI lists them: no url, `loc` from the body."""
    out: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False):
        item: dict[str, Any] = dict(err)
        item["loc"] = ("body", *prefix, *err["loc"])
        out.append(item)
    return out


def validate_tools(tools: Any, tool_choice: Any, messages_have_tools: bool = False) -> tuple[list[dict[str, Any]], Any]:
    """Validate `tools` and `tool_choice`; return (tools as dicts, resolved tool_choice).

    The resolved tool_choice defaults to "none" without tools and "auto" with them (SGLang's
    `set_tool_choice_default`). Raises ToolError.
    """
    errors: list[dict[str, Any]] = []
    parsed: list[Tool] | None = None
    try:
        parsed = _TOOLS.validate_python(tools)
    except ValidationError as e:
        errors += _errors(e, ("tools",))
    if tool_choice is None:
        tool_choice = "auto" if tools is not None or messages_have_tools else "none"
    choice: Any = None
    try:
        choice = _CHOICE.validate_python(tool_choice)
    except ValidationError as e:
        errors += _errors(e, ("tool_choice",))
    if errors:
        raise ToolError(fastapi_message(errors), schema=True)
    tool_list = parsed or []
    if isinstance(choice, str) and choice.lower() == "required" and not tool_list:
        raise ToolError("Tools cannot be empty if tool choice is set to required.", schema=False)
    if isinstance(choice, ToolChoice):
        if not tool_list:
            raise ToolError("Tools cannot be empty if tool choice is set to a specific tool.", schema=False)
        if not any(t.function.name == choice.function.name for t in tool_list):
            raise ToolError(f"Tool '{choice.function.name}' not found in tools list.", schema=False)
    for i, tool in enumerate(tool_list):
        params = tool.function.parameters
        if params is None:
            continue
        problem = _schema_problem(params)
        if problem:
            raise ToolError(f"Tool {i} function has invalid 'parameters' schema: {problem}", schema=False)
    resolved = (
        {"type": "function", "function": {"name": choice.function.name}} if isinstance(choice, ToolChoice) else choice
    )
    return [t.model_dump() for t in tool_list], resolved


def _schema_problem(schema: object) -> str | None:
    """Why `schema` is not a valid JSON Schema (2020-12), or None (serving_chat's check)."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        return str(e)
    except RecursionError:
        return "too deeply nested"
    return None


# --------------------------------------------------------------------- the call decision


class PlannedCall(msgspec.Struct, frozen=True):
    """The one tool call the model makes this turn."""

    name: str
    arguments: str  # JSON text as the model writes it
    call_id: str  # functions.{name}:{index}
    index: int = 0  # position in this response's tool_calls


_WORD = re.compile(r"[A-Za-z0-9]+")
_ASKS_FOR_TOOL = re.compile(
    r"\b(use|call|invoke|run)\b[^.?!]{0,40}\b(tool|function)\b|"
    r"\buse the \w+ (tool|function)\b",
    re.IGNORECASE,
)
_GENERIC = frozenset(
    {
        "get",
        "set",
        "list",
        "fetch",
        "do",
        "make",
        "the",
        "a",
        "an",
        "to",
        "of",
        "for",
        "by",
        "and",
        "tool",
        "function",
        "api",
        "v1",
        "v2",
    }
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_CAPITALISED = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*\b")
_TEXTY = (
    "city",
    "location",
    "place",
    "name",
    "query",
    "q",
    "topic",
    "term",
    "keyword",
    "text",
    "title",
    "symbol",
    "ticker",
    "country",
    "address",
    "destination",
    "origin",
    "user",
)


def _name_words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in _WORD.findall(spaced) if len(w) >= 3} - _GENERIC


def _choose_tool(tools: list[dict[str, Any]], tool_choice: Any, user_text: str) -> dict[str, Any] | None:
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        wanted = tool_choice["function"]["name"]
        return next(t for t in tools if t["function"]["name"] == wanted)
    words = {w.lower() for w in _WORD.findall(user_text)}
    scored = [(len(_name_words(t["function"]["name"]) & words), i) for i, t in enumerate(tools)]
    best, i = max(scored, key=lambda s: (s[0], -s[1]))
    if best > 0:
        return tools[i]
    if tool_choice == "required" or _ASKS_FOR_TOOL.search(user_text):
        return tools[0]
    return None


def _value(prop: str, spec: Any, user_text: str, used: set[str]) -> Any:
    spec = spec if isinstance(spec, dict) else {}
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return spec["enum"][0]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "number"):
        m = _NUMBER.search(user_text)
        if m:
            num = float(m.group())
            return int(num) if kind == "integer" else num
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    if prop.lower() in _TEXTY or any(prop.lower().endswith(t) for t in _TEXTY):
        for m in _CAPITALISED.finditer(user_text):
            if m.start() > 0 and m.group() not in used:
                used.add(m.group())
                return m.group()
        words = [w for w in _WORD.findall(user_text) if len(w) > 3]
        if words:
            return " ".join(words[-3:])
    return "example"


def _arguments(tool: dict[str, Any], user_text: str) -> str:
    params = tool["function"].get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    if not isinstance(props, dict) or not props:
        return "{}"
    required = params.get("required") if isinstance(params, dict) else None
    names = [p for p in required if p in props] if isinstance(required, list) and required else list(props)
    used: set[str] = set()
    return json.dumps({p: _value(p, props[p], user_text, used) for p in names}, ensure_ascii=False)


def plan_call(
    tools: list[dict[str, Any]], tool_choice: Any, messages: list[tuple[str, str]], history_tool_calls: int
) -> PlannedCall | None:
    """The tool call this turn makes, or None (answer in text). `messages` are (role, text)."""
    forced = isinstance(tool_choice, dict) or tool_choice == "required"
    if (not messages or messages[-1][0] != "user") and not forced:
        return None  # after a tool result the model answers in text
    user_text = next((t for r, t in reversed(messages) if r == "user"), "")
    tool = _choose_tool(tools, tool_choice, user_text)
    if tool is None:
        return None
    name = tool["function"]["name"]
    return PlannedCall(name, _arguments(tool, user_text), f"functions.{name}:{history_tool_calls}")


def _split(text: str) -> list[str]:
    return [text[i : i + _PIECE_CHARS] for i in range(0, len(text), _PIECE_CHARS)] or [""]


def call_pieces(call: PlannedCall) -> list[tuple[str, str]]:
    """The call as generated tokens: (text, part) with part in marker | id | args."""
    out: list[tuple[str, str]] = [(SECTION_BEGIN, "marker"), (CALL_BEGIN, "marker")]
    out += [(p, "id") for p in _split(call.call_id)]
    out.append((ARG_BEGIN, "marker"))
    out += [(p, "args") for p in _split(call.arguments)]
    out += [(CALL_END, "marker"), (SECTION_END, "marker")]
    return out
