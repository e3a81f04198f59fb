"""LoRA adapter names read as SGLang reads them, and the cards that say where adapters are loaded."""

from __future__ import annotations

import json

import pytest

from backends.loads import parse_model_cards
from gateway.adapters import split_model
from gateway.errors import ApiError
from gateway.openai_request import parse

SERVED = ["kimi-k2.6", "qwen3.6-27b", "s3://bucket/model:v2"]


@pytest.mark.parametrize(
    "model,expected",
    [
        ("kimi-k2.6", ("kimi-k2.6", None)),
        ("kimi-k2.6:legal-style", ("kimi-k2.6", "legal-style")),
        ("kimi-k2.6: padded ", ("kimi-k2.6", "padded")),
        ("kimi-k2.6:", ("kimi-k2.6", None)),  # an empty adapter is the base model (SGLang: `or None`)
        ("kimi-k2.6:a:b", ("kimi-k2.6", "a:b")),  # only the first colon after the served name splits
        ("s3://bucket/model:v2", ("s3://bucket/model:v2", None)),  # an exact served name, colons and all
        ("s3://bucket/model:v2:style", ("s3://bucket/model:v2", "style")),  # the longest served prefix
        ("other:style", ("other:style", None)),  # no served model: left whole for the 404
    ],
)
def test_split_model_follows_sglang(model, expected):
    assert split_model(model, SERVED) == expected


def _chat(**fields) -> bytes:
    return json.dumps({"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize(
    "lora_path,expected",
    [(None, set()), ("style", {"style"}), (["a", None, "b", "a"], {"a", "b"}), ("", set())],
)
def test_lora_path_names_the_adapters_a_request_needs(lora_path, expected):
    assert parse(_chat(lora_path=lora_path), "chat").lora_paths == expected


@pytest.mark.parametrize("bad", [3, {"name": "x"}, ["a", 1]])
def test_a_lora_path_of_another_type_is_a_400_naming_it(bad):
    with pytest.raises(ApiError) as e:
        parse(_chat(lora_path=bad), "chat")
    assert e.value.status == 400 and e.value.param == "lora_path"


def _sglang_models(*adapters: str) -> dict:
    """SGLang 0.5.23's /v1/models (`available_models`): the base card, then one per adapter."""
    base = {"id": "kimi-k2.6", "object": "model", "created": 1, "owned_by": "sglang", "root": "kimi-k2.6"}
    cards = [{**base, "parent": None, "max_model_len": 262144}]
    cards += [{**base, "id": a, "root": f"/loras/{a}", "parent": "kimi-k2.6", "max_model_len": None} for a in adapters]
    return {"object": "list", "data": cards}


def test_model_cards_give_the_context_length_and_the_adapters():
    cards = parse_model_cards(_sglang_models("style", "legal"), "kimi-k2.6")
    assert cards is not None and cards.max_model_len == 262144 and cards.adapters == {"style", "legal"}
    bare = parse_model_cards(_sglang_models(), "kimi-k2.6")
    assert bare is not None and bare.adapters == frozenset() and bare.max_model_len == 262144
    # an unknown served name: the first base card, never an adapter's
    other = parse_model_cards(_sglang_models("style"), "renamed")
    assert other is not None and other.max_model_len == 262144
    assert parse_model_cards({"data": "nope"}, "kimi-k2.6") is None


def test_prefixes_are_tracked_per_radix_cache_namespace():
    """SGLang keys its radix cache by adapter, extra_key and cache_salt too: the same history under
    another of them shares no prefix; with none of them the chain is the plain one."""
    from gateway.reading import prefix_keys
    from policies.prefix import message_blocks

    def prefix_chain(parsed, adapter):
        return prefix_keys(parsed, adapter)[0]

    fields = {"messages": [{"role": "user", "content": "x" * 2000}]}
    base = prefix_chain(parse(_chat(**fields), "chat"), None)
    assert base == message_blocks(fields["messages"]) and len(base) >= 7
    styled = prefix_chain(parse(_chat(**fields), "chat"), "style")
    by_path = prefix_chain(parse(_chat(lora_path="style", **fields), "chat"), None)
    salted = prefix_chain(parse(_chat(cache_salt="tenant-1", **fields), "chat"), None)
    keyed = prefix_chain(parse(_chat(extra_key="k", **fields), "chat"), None)
    assert styled == by_path  # the same adapter, however it was named
    assert len({base[0], styled[0], salted[0], keyed[0]}) == 4
    assert prefix_chain(parse(_chat(cache_salt="tenant-1", **fields), "chat"), None) == salted
