"""Checking the `tools` of a dataset line before anything is sent.

A request's tools are OpenAI function tools: `{"type": "function", "function": {"name", "description"?,
"parameters"?}}`. The name follows OpenAI's rule (letters, digits, `_` and `-`, at most 64). The
parameters, when given, are checked as SGLang 0.5.23 checks them (`serving_chat.py`,
`_validate_request`): first non-standard `type` names from database tooling are rewritten to JSON
Schema's (`varchar` -> `string`, `int32` -> `integer`: `function_call/utils.py`,
`normalize_json_schema_types`), then jsonschema's Draft 2020-12 meta-schema must accept the result
(`Draft202012Validator.check_schema`); SGLang answers 400 otherwise, and to a schema nested too deeply.
A dataset that would only collect 400s is refused here instead, with the line and the place in the
schema that are wrong. The dataset's tools are sent as they are: SGLang rewrites the types itself.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs installed
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]  # no stubs installed

__all__ = ["ToolSchemaError", "check_tool_choice", "check_tools", "parameters_problem"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
            problem = parameters_problem(fn["parameters"])
            if problem:
                raise ToolSchemaError(f"{where}.function.parameters: {problem}")
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


def parameters_problem(schema: object) -> str | None:
    """Why SGLang would refuse `schema` as a tool's `parameters`, in one line, or None."""
    try:
        normalized = copy.deepcopy(schema)
        _normalize_types(normalized)
        Draft202012Validator.check_schema(normalized)
    except SchemaError as e:
        return f"not a valid JSON Schema (Draft 2020-12, as SGLang checks it): {e.message} at {e.json_path}"
    except RecursionError:
        return "nested too deeply (SGLang refuses it)"
    return None


# SGLang's rewrites of `type` names (function_call/utils.py): whole names, then prefixes that end the
# name or are followed by a digit, bracket or space (`int32`, `list[str]`, not `internal`).
_STANDARD_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_TYPE_ALIASES = {
    **dict.fromkeys(
        (
            *("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time", "timestamp"),
            *("binary", "blob", "bytea", "bytes", "varbinary"),
        ),
        "string",
    ),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}
_TYPE_PREFIXES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
_PREFIX_END = frozenset("0123456789[<( \t")
# Where SGLang looks for nested schemas: maps of schemas, lists of schemas, single schemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = (
    *("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames"),
    *("unevaluatedItems", "unevaluatedProperties"),
)


def _normalize_type(raw: object) -> object:
    if not isinstance(raw, str) or raw in _STANDARD_TYPES:
        return raw
    base = raw.split("(", 1)[0].strip().lower()  # varchar(255), decimal(10,2)
    if base in _STANDARD_TYPES:
        return base
    if base in _TYPE_ALIASES:
        return _TYPE_ALIASES[base]
    for prefixes, target in _TYPE_PREFIXES:
        if any(base == p or (base.startswith(p) and base[len(p) : len(p) + 1] in _PREFIX_END) for p in prefixes):
            return target
    return raw


def _normalize_types(schema: object) -> None:
    """SGLang's `normalize_json_schema_types`, in place (on a copy)."""
    if isinstance(schema, list):
        for item in schema:
            _normalize_types(item)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = _normalize_type(kind)
    elif isinstance(kind, list):
        kinds: list[object] = []
        for k in map(_normalize_type, kind):
            if k not in kinds:  # ["int", "integer"] is one type, as SGLang makes it
                kinds.append(k)
        schema["type"] = kinds
    for key in _SCHEMA_MAPS:
        nested = schema.get(key)
        if isinstance(nested, dict):
            for sub in nested.values():
                _normalize_types(sub)
    for key in _SCHEMA_LISTS:
        nested = schema.get(key)
        if isinstance(nested, list):
            for sub in nested:
                _normalize_types(sub)
    for key in _SCHEMA_ONES:
        if key in schema:
            _normalize_types(schema[key])
