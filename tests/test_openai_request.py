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
        ("chat", {"n": True}, 1),  # not a count: the backend refuses it, with its own message
        ("chat", {"n": 0}, 1),
        ("completion", {"prompt": "a b c", "n": 2}, 2),
        ("completion", {"prompt": ["a", "b", "c"], "n": 2}, 6),  # a batch: n per prompt
        ("completion", {"prompt": [[1, 2], [3, 4]]}, 2),  # a batch of token-id prompts
        ("completion", {"prompt": [1, 2, 3], "n": 4}, 4),  # one prompt of token ids
    ],
)
def test_the_sequences_a_request_asks_for_are_counted(kind, fields, sequences) -> None:
    body = {"model": "m", **({"messages": [{"role": "user", "content": "hi"}]} if kind == "chat" else {}), **fields}
    assert parse(json.dumps(body).encode(), kind).sequences == sequences


def test_token_id_prompts_are_counted_exactly() -> None:
    one = parse(json.dumps({"model": "m", "prompt": list(range(300))}).encode(), "completion")
    assert one.id_tokens == 300 and one.prompt_ids == list(range(300)) and one.sequences == 1
    batch = parse(json.dumps({"model": "m", "prompt": [[1, 2, 3], [4, 5], "text"]}).encode(), "completion")
    assert batch.id_tokens == 5 and batch.prompt_ids is None and batch.sequences == 3
    text = parse(json.dumps({"model": "m", "prompt": "a b c"}).encode(), "completion")
    assert text.id_tokens == 0 and text.prompt_ids is None
