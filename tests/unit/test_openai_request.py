"""The gateway's request parser refuses bad bodies with a 400 naming the problem, on every msgspec
version the floors allow (before 0.23 invalid UTF-8 raised UnicodeDecodeError, not DecodeError)."""

import json

import pytest

from gateway.errors import ApiError
from gateway.openai_request import parse


@pytest.mark.parametrize(
    "body,words",
    [
        (b'{"model": "kimi-k2.6", "messages": [{"role": "user", "content": "\xff"}]}', "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b'{"model": "m", "messages": [], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "not valid JSON"),  # too deep
        (b"   ", "empty"),
        (b"[1]", "JSON object"),
    ],
)
def test_bad_body_is_a_400_that_says_why(body: bytes, words: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(body, "chat")
    assert info.value.status == 400 and words in str(info.value)


def test_a_good_body_names_its_model() -> None:
    parsed = parse(b'{"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}]}', "chat")
    assert parsed.model == "kimi-k2.6"


@pytest.mark.parametrize(
    "kind,fields,sequences",
    [
        ("chat", {"n": 3}, 3),
        ("chat", {}, 1),
        ("chat", {"n": None}, 1),
        ("completion", {"prompt": "a b c", "n": 2}, 2),
        ("completion", {"prompt": ["a", "b", "c"], "n": 2}, 6),  # a batch: n per prompt
        ("completion", {"prompt": [[1, 2], [3, 4]]}, 2),  # a batch of token-id prompts
        ("completion", {"prompt": [1, 2, 3], "n": 4}, 4),  # one prompt of token ids
    ],
)
def test_the_sequences_a_request_asks_for_are_counted(kind, fields, sequences) -> None:
    body = {"model": "m", **({"messages": [{"role": "user", "content": "hi"}]} if kind == "chat" else {}), **fields}
    assert parse(json.dumps(body).encode(), kind).sequences == sequences


_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "kind,fields,param,words",
    [
        # SGLang admits any n: one request asking for 10^20 samples took a twin's memory, then the
        # next backend's when the gateway moved it there
        ("chat", {"n": 99999999999999999999}, "n", "from 1 to 128"),
        ("chat", {"n": 129}, "n", "from 1 to 128"),
        ("completion", {"prompt": "a", "n": 0}, "n", "from 1 to 128"),
        ("chat", {"n": "two"}, "n", "an integer"),
        ("chat", {"n": 1.5}, "n", "an integer"),
        ("chat", {"n": "129"}, "n", "from 1 to 128"),
        ("chat", {"max_tokens": 10.5}, "max_tokens", "an integer"),
        ("chat", {"stream": "maybe"}, "stream", "a boolean"),
        ("chat", {"stream": 2}, "stream", "a boolean"),
        ("chat", {"priority": [1]}, "priority", "an integer"),
        (
            "chat",
            {"stream": True, "stream_options": {"include_usage": "often"}},
            "stream_options.include_usage",
            "a boolean",
        ),
        ("chat", {"max_completion_tokens": -1}, "max_completion_tokens", ">= 0"),
        ("chat", {"max_tokens": -1}, "max_tokens", ">= 0"),
        ("completion", {"prompt": "a", "max_tokens": -1}, "max_tokens", ">= 0"),
        ("responses", {"input": "a", "max_output_tokens": -5}, "max_output_tokens", ">= 0"),
        ("chat", {"temperature": "hot"}, "temperature", "a number"),
        ("chat", {"temperature": [0.5]}, "temperature", "a number"),
        ("chat", {"temperature": -1}, "temperature", ">= 0"),
        ("chat", {"top_p": 0}, "top_p", "(0, 1]"),
        ("chat", {"top_p": 1.5}, "top_p", "(0, 1]"),
        ("chat", {"top_p": "x"}, "top_p", "a number"),
        ("chat", {"tools": 5}, "tools", "an array"),
        ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "a string or an array"),
    ],
)
def test_a_bad_field_is_refused_by_name(kind, fields, param, words) -> None:
    body = {**(_CHAT if kind == "chat" else {"model": "m"}), **fields}
    with pytest.raises(ApiError) as info:
        parse(json.dumps(body).encode(), kind)
    assert info.value.status == 400 and info.value.param == param and words in str(info.value)


@pytest.mark.parametrize(
    "fields,temperature",
    [({"temperature": 0}, 0.0), ({"temperature": 2.5, "top_p": 1}, 2.5), ({"temperature": None}, None), ({}, None)],
)
def test_good_sampling_fields_pass(fields, temperature) -> None:
    parsed = parse(
        json.dumps({**_CHAT, "messages": [{"role": "assistant", "content": None}], **fields}).encode(), "chat"
    )
    assert parsed.temperature == temperature


def test_fields_are_read_as_sglangs_pydantic_models_read_them() -> None:
    """FastAPI validates in pydantic's lax mode: these bodies reach SGLang's handler as numbers and
    booleans, so the gateway must route them, not refuse them."""
    body = {
        **_CHAT,
        "max_tokens": "10",
        "stream": "true",
        "stream_options": {"include_usage": 1},
        "temperature": "0.5",
        "top_p": "1",
        "n": 2.0,
        "priority": "3",
    }
    parsed = parse(json.dumps(body).encode(), "chat")
    assert (parsed.max_tokens, parsed.stream, parsed.client_wants_usage) == (10, True, True)
    assert (parsed.temperature, parsed.sequences, parsed.priority) == (0.5, 2, 3)
    assert parsed.body.to_builtins() == body  # it goes upstream as it came: SGLang converts it the same way
    flags = parse(json.dumps({**_CHAT, "max_tokens": True, "stream": "off", "n": "1"}).encode(), "chat")
    assert (flags.max_tokens, flags.stream, flags.sequences) == (1, False, 1)
    responses = parse(json.dumps({"model": "m", "input": "a", "max_output_tokens": 12.0}).encode(), "responses")
    assert responses.max_tokens == 10 and responses.store is True  # SGLang's default
    # SGLang reads `max_completion_tokens or max_tokens`: a 0 gives way to max_tokens
    zero = parse(json.dumps({**_CHAT, "max_completion_tokens": 0, "max_tokens": 50}).encode(), "chat")
    assert zero.max_tokens == 50
    assert parse(json.dumps({**_CHAT, "max_completion_tokens": 0}).encode(), "chat").max_tokens is None
    unstored = parse(json.dumps({"model": "m", "input": "a", "store": "false"}).encode(), "responses")
    assert unstored.store is False


def test_token_id_prompts_are_counted_exactly() -> None:
    one = parse(json.dumps({"model": "m", "prompt": list(range(300))}).encode(), "completion")
    assert one.id_tokens == 300 and one.prompt_ids == list(range(300)) and one.sequences == 1
    batch = parse(json.dumps({"model": "m", "prompt": [[1, 2, 3], [4, 5], "text"]}).encode(), "completion")
    assert batch.id_tokens == 5 and batch.prompt_ids is None and batch.sequences == 3
    text = parse(json.dumps({"model": "m", "prompt": "a b c"}).encode(), "completion")
    assert text.id_tokens == 0 and text.prompt_ids is None
