"""Conversation prefixes (policies.prefix) and the prefix tracker's bounds."""

from __future__ import annotations

from policies.prefix import BLOCK_CHARS, MAX_BLOCKS, message_blocks, render_history, text_blocks


def _turns() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    first = [{"role": "system", "content": "You are a careful assistant. " * 80},
             {"role": "user", "content": "Explain the radix cache in SGLang. " * 40}]
    second = [*first, {"role": "assistant", "content": "It keeps the KV of served prompts in a tree. " * 30},
              {"role": "user", "content": "And how is it evicted?"}]
    return first, second


def test_a_next_turn_shares_every_full_block_of_the_earlier_request() -> None:
    first, second = _turns()
    a, b = message_blocks(first), message_blocks(second)
    assert len(a) >= 2 and len(b) > len(a)
    assert b[:len(a)] == a


def test_a_different_history_shares_nothing_from_the_first_difference_on() -> None:
    first, _ = _turns()
    other = [first[0], {"role": "user", "content": "Something else entirely. " * 120}]
    a, b = message_blocks(first), message_blocks(other)
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    # The system prompt's full blocks agree; once the texts part, no later element agrees either.
    assert common >= 1
    assert all(x != y for x, y in zip(a[common:], b[common:], strict=False))


def test_roles_and_message_boundaries_change_the_chain() -> None:
    text = "word " * 800
    assert message_blocks([{"role": "user", "content": text}]) != message_blocks([{"role": "system", "content": text}])
    split = [{"role": "user", "content": text[:2000]}, {"role": "user", "content": text[2000:]}]
    assert message_blocks(split) != message_blocks([{"role": "user", "content": text}])


def test_the_partial_last_block_is_left_out_and_work_is_capped() -> None:
    assert text_blocks("x" * (BLOCK_CHARS - 1)) == ()
    assert len(text_blocks("x" * (3 * BLOCK_CHARS + 7))) == 3
    assert len(message_blocks([{"role": "user", "content": "y" * (BLOCK_CHARS * (MAX_BLOCKS + 50))}])) == MAX_BLOCKS


def test_odd_shapes_are_read_not_rejected() -> None:
    odd = ["not a message", {"role": 3, "content": [{"type": "image_url"}, {"type": "text", "text": "z" * 2400}]},
           {"role": "assistant", "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}, "junk"]}]
    assert len(message_blocks(odd)) == len(render_history(odd)) // BLOCK_CHARS >= 9
