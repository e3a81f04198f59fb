"""The gateway's request parser refuses bad bodies with a 400 naming the problem, on every msgspec
version the floors allow (before 0.23 invalid UTF-8 raised UnicodeDecodeError, not DecodeError)."""

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
