"""loadgen's check of a dataset's tool `parameters`: what SGLang 0.5.23 refuses, and only that.

SGLang rewrites database-style type names (`varchar`, `int32`) to JSON Schema's, then checks the
schema with jsonschema's Draft 2020-12 meta-schema (`serving_chat.py`, `_validate_request`). The
first list holds schemas that check refuses and loadgen's former hand-written check let through (a
dataset of them collected only 400s); the second, schemas SGLang accepts that the former check
refused.
"""

from __future__ import annotations

import pytest

from loadgen.tool_schema import ToolSchemaError, check_tools, parameters_problem


def _tools(parameters: object) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def _object(**properties: object) -> dict:
    return {"type": "object", "properties": properties}


REFUSED = [
    (_object(n={"type": "integer", "minimum": "0"}), "'0' is not of type 'number' at $.properties.n.minimum"),
    ({"type": "object", "additionalProperties": "no"}, "at $.additionalProperties"),
    (_object(v={"anyOf": []}), "[] should be non-empty at $.properties.v.anyOf"),
    (_object(s={"type": "string", "maxLength": -1}), "at $.properties.s.maxLength"),
    (_object(a={"$ref": 5}), "5 is not of type 'string'"),
    ({**_object(a={"type": "string"}), "required": ["a", "a"]}, "has non-unique elements at $.required"),
    (_object(d={"type": "string", "format": 5}), "at $.properties.d.format"),
    (_object(d={"type": "string", "pattern": "("}), "'(' is not a 'regex' at $.properties.d.pattern"),
    (_object(d={"oneOf": {"type": "string"}}), "is not of type 'array' at $.properties.d.oneOf"),
    (_object(d={"anyOf": [{"type": "strnig"}]}), "at $.properties.d.anyOf[0].type"),
]


@pytest.mark.parametrize(("schema", "expected"), REFUSED)
def test_schemas_sglang_refuses_are_refused_with_the_place(schema: dict, expected: str) -> None:
    with pytest.raises(ToolSchemaError) as info:
        check_tools(_tools(schema))
    message = str(info.value)
    assert message.startswith("tools[0].function.parameters: not a valid JSON Schema (Draft 2020-12")
    assert expected in message and "\n" not in message


ACCEPTED = [
    _object(x={"type": "varchar(255)"}),  # SGLang rewrites it to "string"
    _object(x={"type": ["int32", "null"]}),  # -> ["integer", "null"]
    _object(x={"type": ["int", "integer"]}),  # -> ["integer"]: the duplicate goes
    {"type": "object", "properties": {}, "required": ["y"]},  # valid JSON Schema, if useless
    _object(e={"enum": []}),
    {"type": "string"},
    True,
]


@pytest.mark.parametrize("schema", ACCEPTED)
def test_schemas_sglang_accepts_pass(schema: object) -> None:
    assert parameters_problem(schema) is None
    assert check_tools(_tools(schema)) == _tools(schema)


def test_the_tools_are_sent_as_written() -> None:
    """The type rewrite happens on a copy: SGLang makes it itself, on what it is sent."""
    tools = _tools(_object(x={"type": "varchar"}))
    assert check_tools(tools)[0]["function"]["parameters"]["properties"]["x"]["type"] == "varchar"


def test_a_schema_nested_too_deeply_is_refused_not_a_crash() -> None:
    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["items"] = {}
        cur = cur["items"]
    assert parameters_problem(deep) == "nested too deeply (SGLang refuses it)"
