"""A radix-style prefix cache over hash chains of fixed-size token blocks, bounded and LRU.

SGLang keeps every prompt (and, when a request finishes, prompt + output) in a radix tree over
token ids; a new request whose prompt starts with a cached sequence skips prefilling it. The twin
has no token ids, so a prompt is described by a *hash chain*: element i identifies the prompt's
first (i + 1) * PREFIX_BLOCK_TOKENS tokens (it hashes element i - 1 with block i's content). Two
prompts share a cached prefix exactly as far as their chains agree, which is what a radix tree
gives at block granularity (SGLang matches at page granularity too; page size 1 by default, so the
twin rounds a match down to whole blocks: an assumption that costs at most one block per hit).

Eviction is LRU over blocks with a radix tree's invariant kept: a block is always touched after
its descendants, so it is never older than any of them and the least recently used block is
always a leaf. Evicting it never orphans a cached descendant.

SGLang keys the tree by a namespace as well as the tokens: the request's `extra_key` with its LoRA
adapter's id appended (`managers/schedule_batch.py`, `Req.__init__`), so a prefix cached under one
adapter is no hit for another or for the base model. A chain starts from its namespace's root
(`namespace_root`; 0 for the base model) for the same reason.

Pure and cheap: no clock, no I/O; match and insert cost O(blocks of the prompt).
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence

__all__ = [
    "PREFIX_BLOCK_TOKENS",
    "PrefixCache",
    "chain_from_text",
    "chain_from_tokens",
    "namespace_root",
]

PREFIX_BLOCK_TOKENS = 64
# The twin counts a prompt token per 4 characters (text.count_prompt_tokens), so a block of
# PREFIX_BLOCK_TOKENS tokens is this many characters of rendered prompt.
_CHARS_PER_TOKEN = 4
BLOCK_CHARS = PREFIX_BLOCK_TOKENS * _CHARS_PER_TOKEN


def _link(parent: int, content: bytes) -> int:
    h = hashlib.blake2b(parent.to_bytes(8, "little") + content, digest_size=8)
    return int.from_bytes(h.digest(), "little")


def namespace_root(key: str | None) -> int:
    """The parent of a namespace's first block: 0 for none (the base model), else a stable hash."""
    return 0 if not key else _link(0, key.encode())


def chain_from_text(text: str, root: int = 0) -> list[int]:
    """The hash chain of a rendered prompt: one element per whole block of BLOCK_CHARS chars,
    the first linked to `root` (its radix-cache namespace: `namespace_root`).

    A trailing partial block is not part of the chain (it cannot be matched as a whole block).
    """
    data = text.encode()
    chain: list[int] = []
    parent = root
    for start in range(0, len(data) - BLOCK_CHARS + 1, BLOCK_CHARS):
        parent = _link(parent, data[start : start + BLOCK_CHARS])
        chain.append(parent)
    return chain


def chain_from_tokens(num_tokens: int, seed: int | str, parent: Sequence[int] = ()) -> list[int]:
    """A synthetic chain for `num_tokens` tokens (sessions on a virtual clock).

    `parent` is the chain of a shorter sequence this one extends (the previous turn's prompt +
    output): the result starts with it and adds blocks derived from `seed` up to
    num_tokens // PREFIX_BLOCK_TOKENS blocks. Two calls with the same parent and seed agree; a
    different seed diverges right after the parent.
    """
    total = num_tokens // PREFIX_BLOCK_TOKENS
    chain = list(parent[:total])
    prev = chain[-1] if chain else 0
    tag = str(seed).encode()
    for i in range(len(chain), total):
        prev = _link(prev, tag + b"\x1f" + i.to_bytes(4, "little"))
        chain.append(prev)
    return chain


class PrefixCache:
    """Cached blocks with LRU eviction; capacity in tokens (a multiple of the block size)."""

    __slots__ = ("_blocks", "capacity_tokens")

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._blocks: collections.OrderedDict[int, None] = collections.OrderedDict()

    @property
    def num_tokens(self) -> int:
        return len(self._blocks) * PREFIX_BLOCK_TOKENS

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, chain: Sequence[int]) -> int:
        """Number of leading blocks of `chain` that are cached (does not touch LRU order)."""
        n = 0
        blocks = self._blocks
        for b in chain:
            if b not in blocks:
                break
            n += 1
        return n

    def insert(self, chain: Sequence[int], limit_tokens: int | None = None) -> int:
        """Cache `chain` (touching its cached part), then evict LRU blocks down to the limit.

        `limit_tokens` (default: the capacity) is what the cache may hold right now: the KV
        pool minus what running requests pin. Returns the number of newly cached blocks.
        Blocks are touched leaf first so that every block stays newer than its descendants.
        """
        blocks = self._blocks
        added = 0
        for b in reversed(chain):
            if b in blocks:
                blocks.move_to_end(b)
            else:
                blocks[b] = None
                added += 1
        self.evict_to(self.capacity_tokens if limit_tokens is None else limit_tokens)
        return added

    def evict_to(self, limit_tokens: int) -> int:
        """Drop least recently used blocks until at most `limit_tokens` are cached."""
        blocks = self._blocks
        keep = max(0, limit_tokens) // PREFIX_BLOCK_TOKENS
        dropped = 0
        while len(blocks) > keep:
            blocks.popitem(last=False)
            dropped += 1
        return dropped

    def clear(self) -> None:
        self._blocks.clear()
