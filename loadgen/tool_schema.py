"""Checking the `tools` of a dataset line before anything is sent.

A request's tools are OpenAI function tools: `{"type": "function", "function": {"name", "description"?,
"parameters"?}}`. The name follows OpenAI's rule (letters, digits, `_` and `-`, at most 64); the
parameters, when given, are a JSON Schema for an object. SGLang validates them with jsonschema's
Draft 2020-12 meta-schema and answers 400 otherwise (`serving_chat.py::_validate_request`): a
dataset that would only collect 400s is refused here instead, with the line that is wrong. The check
is structural (the common mistakes), not a full meta-schema validation.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ToolSchemaError", "check_tool_choice", "check_tools"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


class ToolSchemaError(ValueError):
    """What is wrong with a tools list; one line."""


def check_tools(tools: object) -> list[dict[str, Any]]:
    """`tools` as a list of function tools, or ToolSchemaError saying which tool is wrong."""
    if not isinstance(tools, list) or not tools:
        raise ToolSchemaError("'tools' must be a non-empty list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ToolSchemaError(f"{where} must be an object")
        if tool.get("type") != "function":
            raise ToolSchemaError(f"{where}: 'type' must be \"function\"")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ToolSchemaError(f"{where}: 'function' must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolSchemaError(f"{where}: function name {name!r} must be 1-64 letters, digits, '_' or '-'")
        if name in names:
            raise ToolSchemaError(f"{where}: function name {name!r} appears twice")
        names.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise ToolSchemaError(f"{where}: 'description' must be a string")
        if fn.get("parameters") is not None:
            _check_schema(fn["parameters"], f"{where}.function.parameters", top=True)
    return tools


def check_tool_choice(choice: object, tools: list[dict[str, Any]] | None) -> None:
    """`tool_choice`: none | auto | required, or `{"type": "function", "function": {"name"}}` naming one
    of the tools (SGLang answers 400 otherwise)."""
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ToolSchemaError(f"'tool_choice' {choice!r} must be none, auto, required or a function")
        if choice == "required" and not tools:
            raise ToolSchemaError("'tool_choice' required needs 'tools'")
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ToolSchemaError('\'tool_choice\' must be a string or {"type": "function", "function": {"name": ...}}')
    if not tools or name not in {t["function"]["name"] for t in tools}:
        raise ToolSchemaError(f"'tool_choice' names {name!r}, which is not in 'tools'")


def _check_schema(schema: object, where: str, *, top: bool = False) -> None:
    if isinstance(schema, bool):  # true / false are valid schemas
        return
    if not isinstance(schema, dict):
        raise ToolSchemaError(f"{where} must be a JSON Schema object")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            raise ToolSchemaError(f"{where}: unknown type {k!r}")
    if top and kinds and kinds != ["object"]:
        raise ToolSchemaError(f'{where}: the parameters schema must have type "object"')
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ToolSchemaError(f"{where}: 'properties' must be an object")
        for key, sub in props.items():
            _check_schema(sub, f"{where}.properties.{key}")
    required = schema.get("required")
    if required is not None:
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ToolSchemaError(f"{where}: 'required' must be a list of property names")
        missing = [r for r in required if isinstance(props, dict) and r not in props]
        if missing:
            raise ToolSchemaError(f"{where}: 'required' names {missing[0]!r}, which is not in 'properties'")
    items = schema.get("items")
    if items is not None:
        _check_schema(items, f"{where}.items")
    enum = schema.get("enum")
    if enum is not None and (not isinstance(enum, list) or not enum):
        raise ToolSchemaError(f"{where}: 'enum' must be a non-empty list")
