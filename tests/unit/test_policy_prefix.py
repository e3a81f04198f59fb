"""Conversation prefixes (policies.prefix) and the prefix tracker's bounds."""

from __future__ import annotations

from backends import BackendSpec, Strategy
from policies import BackendView, Domain, Goodput, RequestFeatures
from policies.prefix import BLOCK_CHARS, MAX_BLOCKS, message_blocks, text_blocks
from policies.prefix_cache import TRACKED_TOKENS, PrefixCache


def _turns() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    first = [
        {"role": "system", "content": "You are a careful assistant. " * 80},
        {"role": "user", "content": "Explain the radix cache in SGLang. " * 40},
    ]
    second = [
        *first,
        {"role": "assistant", "content": "It keeps the KV of served prompts in a tree. " * 30},
        {"role": "user", "content": "And how is it evicted?"},
    ]
    return first, second


def test_a_next_turn_shares_every_full_block_of_the_earlier_request() -> None:
    first, second = _turns()
    a, b = message_blocks(first), message_blocks(second)
    assert len(a) >= 2 and len(b) > len(a)
    assert b[: len(a)] == a


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
    odd = [
        "not a message",
        {"role": 3, "content": [{"type": "image_url"}, {"type": "text", "text": "z" * 2400}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}, "junk"]},
    ]
    readable = [m for m in odd if isinstance(m, dict)]
    assert len(message_blocks(odd)) == len(message_blocks(readable)) >= 9


def test_prefix_tracking_stays_bounded_at_a_million_distinct_conversations() -> None:
    cache = PrefixCache()
    names = [f"b{i}" for i in range(4)]
    kv = [65_536, 131_072, 262_144, 16_384]  # different KV budgets: different capacities
    for i in range(1_000_000):  # two tracked blocks per conversation, none shared
        cache.of(names[i & 3], kv[i & 3]).record((i << 2, i << 2 | 1))
    for name, budget in zip(names, kv, strict=True):
        b = cache.backends[name]
        assert b.capacity == budget // TRACKED_TOKENS and len(b.blocks) <= b.capacity
        assert b.evicted >= 500_000 - b.capacity
    # the pool-wide index holds exactly what the backends hold, nothing left behind by evictions
    assert len(cache.index) == cache.held_blocks() <= sum(k // TRACKED_TOKENS for k in kv)
    # recent conversations are still found, old ones are gone
    last = 999_999
    assert cache.depths((last << 2, last << 2 | 1)) == {names[last & 3]: 2}
    assert cache.depths((0, 1)) == {}


def test_the_policy_remembers_where_a_conversation_is_and_goes_back() -> None:
    views = [
        BackendView(spec=BackendSpec(name=n, url="http://x", model="m", strategy=Strategy.DFLASH))
        for n in ("a", "b", "c")
    ]
    policy = Goodput(seed=0, epsilon=0.0)
    # a long agent history (~16k tokens): re-prefilling it elsewhere costs more than waiting
    history = [
        {"role": "system", "content": "Be brief. " * 300},
        {"role": "user", "content": "Summarise the design. " * 2800},
    ]
    turn1 = RequestFeatures(model="m", domain=Domain.CHAT, prompt_tokens=16000, prefix=message_blocks(history))
    first = policy.choose(turn1, views).backend
    first.inflight += 3  # busier than the others now, yet its cache holds the conversation
    history += [{"role": "assistant", "content": "It routes. " * 100}, {"role": "user", "content": "More?"}]
    turn2 = RequestFeatures(model="m", domain=Domain.CHAT, prompt_tokens=16300, prefix=message_blocks(history))
    again = policy.choose(turn2, views)
    assert again.backend is first and "cached" in again.reason
    other = RequestFeatures(
        model="m",
        domain=Domain.CHAT,
        prompt_tokens=16000,
        prefix=message_blocks([{"role": "user", "content": "Unrelated. " * 6000}]),
    )
    assert policy.choose(other, views).backend is not first  # nothing cached anywhere: the least loaded


def test_a_forgotten_backend_holds_nothing() -> None:
    cache = PrefixCache()
    cache.of("a").record((1, 2, 3))
    cache.of("b").record((1, 2))
    assert cache.depths((1, 2, 3)) == {"a": 3, "b": 2}
    cache.forget("a")
    assert cache.depths((1, 2, 3)) == {"b": 2} and set(cache.index) == {1, 2}


def test_a_conversation_in_use_survives_evictions_and_an_idle_one_is_forgotten() -> None:
    cache = PrefixCache(default_kv_tokens=16 * TRACKED_TOKENS)  # 16 blocks
    busy, idle = (1, 2, 3), (7, 8, 9)
    cache.of("a").record(idle)
    for i in range(100):
        cache.of("a").record((1000 + 2 * i, 1001 + 2 * i))  # other traffic, never seen again
        if i % 2 == 0:
            cache.of("a").record(busy, cache.of("a").depth(busy))
        b = cache.backends["a"]
        assert len(b.blocks) <= b.capacity
    b = cache.backends["a"]
    assert cache.depths(busy) == {"a": 3} and b.depth(busy) == 3
    assert cache.depths(idle) == {} and b.depth(idle) == 0
    # the index holds exactly the blocks the backend holds, and it keeps at least 3/4 of its budget
    assert set(cache.index) == set(b.blocks) and b.evicted == 3 + 200 + 3 - len(b.blocks)
    assert len(b.blocks) >= b.capacity * 3 // 4
