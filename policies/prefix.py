"""Conversation prefixes as hash chains of fixed-size blocks of the rendered message history.

SGLang's radix cache keeps the KV of prompts it has served, so a request whose history starts like
an earlier one skips prefill of the shared part, but only on the server that served it. The gateway
does not tokenize; it cuts the history's text into blocks of `BLOCK_CHARS` characters (about
`BLOCK_TOKENS` tokens at the gateway's 4-characters-per-token estimate) and chains their hashes:
element i of the chain identifies the first i+1 blocks, so two requests share element i exactly
when (hash collisions aside) their first (i+1) * BLOCK_CHARS characters agree.

A next turn of a conversation re-sends the history plus the answer and a new message, so every
full block of the earlier request reappears in it unchanged. The trailing partial block is left out:
the next turn extends it, so its hash would never recur.

The hashes are Python's `hash`, salted per process: they are compared inside one gateway only.
SGLang keys its radix cache by the prompt's tokens and a namespace: the request's `extra_key` with
its LoRA adapter's id appended, and its `cache_salt` (`managers/schedule_batch.py`, `Req`;
`mem_cache/radix_cache.py`, `RadixKey`), so a prefix cached for one namespace is no hit for another.
A chain starts from its namespace's hash for the same reason (`namespace`; 0: none).
Work is linear in the history's length and capped at `MAX_BLOCKS` blocks; the tail beyond is not
tracked (a history longer than the cap still shares its first `MAX_BLOCKS` blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

# 64 tokens per block, the twin's radix-cache block (twin/prefix_cache.py), so that one chain
# serves the gateway, the evaluator and the twin alike. The prefix tracker keeps every fourth element
# only (`policies.prefix_cache.TRACK_STRIDE`). The 4 characters per token are the gateway's own
# prompt-size estimate (proxy.py).
BLOCK_TOKENS = 64
CHARS_PER_TOKEN = 4
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN
MAX_BLOCKS = 2048  # 128k tokens: K2.6's context is 256k; past this the cost of hashing outweighs the gain

# Separators no ordinary text contains, so that moving text between role and content or between
# two messages changes the rendering.
_ROLE_END = "\x1f"
_MESSAGE_END = "\x1e"


def namespace(adapter: object, extra_key: object, cache_salt: object) -> int:
    """The seed of the chains of requests cached under these keys (hashable); 0, the chains of
    requests with none, when all are None."""
    if adapter is None and extra_key is None and cache_salt is None:
        return 0
    return hash((adapter, extra_key, cache_salt))


def text_blocks(text: str, seed: int = 0) -> tuple[int, ...]:
    """The hash chain of `text`'s full blocks (a completions prompt, or a rendered history)."""
    return _chain(text, BLOCK_CHARS, seed)


def token_blocks(ids: Sequence[int], seed: int = 0) -> tuple[int, ...]:
    """The hash chain of a token-id prompt's full blocks of `BLOCK_TOKENS` ids: the radix cache's
    own blocks, exactly."""
    return _chain(tuple(ids[: MAX_BLOCKS * BLOCK_TOKENS]), BLOCK_TOKENS, seed)


def _chain(seq: str | tuple[int, ...], size: int, seed: int) -> tuple[int, ...]:
    """Element i hashes element i-1 (`seed` before the first) with the i-th block of `size`
    items; a partial last block and anything past `MAX_BLOCKS` blocks are left out."""
    n = min(len(seq) // size, MAX_BLOCKS)
    chain: list[int] = []
    h = seed
    for i in range(n):
        start = i * size
        h = hash((h, seq[start : start + size]))
        chain.append(h)
    return tuple(chain)


class HistoryMessage(Protocol):
    """A message of a history as the gateway reads it (gateway.openai_request): its role, its
    content (a string, or parts with an optional `text`, as objects or dicts) and its tool calls."""

    @property
    def role(self) -> Any: ...

    @property
    def content(self) -> Any: ...

    @property
    def tool_calls(self) -> Any: ...


class _DictMessage:
    """A message given as a plain dict (the evaluator's and the benchmarks' histories)."""

    __slots__ = ("role", "content", "tool_calls")

    def __init__(self, m: dict[str, Any]) -> None:
        self.role, self.content, self.tool_calls = m.get("role"), m.get("content"), m.get("tool_calls")


def message_blocks(messages: Sequence[Any], seed: int = 0) -> tuple[int, ...]:
    """The hash chain of a chat history's blocks, messages given as dicts. Tolerates any shape
    (non-dict entries and non-text content parts are skipped)."""
    return text_blocks(render_history(_DictMessage(m) for m in messages if isinstance(m, dict)), seed)


def answer_key(rendered: str, chain: Sequence[int], seed: int = 0) -> int:
    """A key of a rendered history (`render_history`) given its chain (`text_blocks`, or any longer
    chain it starts): its last full block's element and the partial block after it, so two
    histories share a key exactly when (hash collisions aside) their renderings are equal. 0: a
    history longer than the chain tracks."""
    blocks = len(rendered) // BLOCK_CHARS
    if blocks > MAX_BLOCKS or blocks > len(chain):
        return 0
    key = hash((chain[blocks - 1] if blocks else seed, rendered[blocks * BLOCK_CHARS :]))
    return key or 1


def render_history(messages: Iterable[HistoryMessage]) -> str:
    """Role, text content and tool calls of each message, in order, up to `MAX_BLOCKS` blocks."""
    limit = MAX_BLOCKS * BLOCK_CHARS
    parts: list[str] = []
    size = 0
    for m in messages:
        if size >= limit:
            break
        role = m.role
        piece = (role if isinstance(role, str) else "") + _ROLE_END + content_text(m.content)
        calls = m.tool_calls
        if isinstance(calls, list):
            piece += _tool_calls_text(calls)
        piece += _MESSAGE_END
        parts.append(piece)
        size += len(piece)
    return "".join(parts)


def content_text(content: Any) -> str:
    """A message's text: a string content, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones, as objects or dicts
        texts = (p.get("text") if isinstance(p, dict) else getattr(p, "text", None) for p in content)
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def _tool_calls_text(calls: list[Any]) -> str:
    out: list[str] = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            name, args = fn.get("name"), fn.get("arguments")
            out.append((name if isinstance(name, str) else "") + _ROLE_END + (args if isinstance(args, str) else ""))
    return "".join(out)
