"""SGLang's NGRAM drafter as the twin models it: a server-wide memory of the text it generated.

What SGLang 0.5.23 does (`srt/speculative/ngram_worker.py`, the trie in
`kernels/jit/csrc/ngram_corpus/trie.cpp`):

- After every verify pass `_update_ngram_corpus` inserts, for each running request, its last
  `max_trie_depth` (18) tokens (the tail of the prompt, then the output) into **one trie per
  server**, shared by all requests; `Trie::insert` adds every suffix of that window, so every
  n-gram (n <= 18) of what the server generates ends up in the trie.
- Prompts are not inserted: the prefill path never feeds the trie ("Whether to insert 'extend'
  into the cache or not ... we will not insert it for now"). Only a prompt's last <= 18 tokens
  enter, inside the first decode window.
- Drafting (`_prepare_draft_tokens`) matches the request's last <= 18 tokens against the trie
  and proposes a tree (a chain with `--speculative-ngram-max-bfs-breadth 1`) of
  `num_draft_tokens - 1` tokens; every request verifies `num_draft_tokens` tokens each step
  whether or not anything matched ("here we always enforce it").
- The trie keeps `--speculative-ngram-capacity` nodes (10M), least recently used evicted.

So an NGRAM server drafts well exactly where a request's output repeats text *this server*
generated recently: a turn that rewrites the model's own previous answer, an agent re-emitting a
file it wrote, a greedy request repeated. Code the user pasted, a tool's output, or anything
another server generated is not in its trie.

The twin keeps, per server, fingerprints of the answers it generated (8-word blocks, enough to
say how much of a later message repeats them) for as many generated tokens as the trie holds at
least (capacity / depth), and the prompt keys of greedy requests it answered. A request's *echo
share* e is the part of its output that repeats remembered text; inside it each draft is
accepted with the profile's `ngram.copy_accept`, elsewhere with its `[acceptance]`.
"""

from __future__ import annotations

import collections
import hashlib
import re
from collections.abc import Sequence

__all__ = [
    "BLOCK_WORDS",
    "COPY_SHARE",
    "NgramMemory",
    "copy_source",
    "copy_step_share",
    "echo_share",
    "fingerprints",
    "rewrite_intent",
]

BLOCK_WORDS = 8  # words per fingerprint block

# The share of an answer that reproduces the text it is asked to rewrite. Derived from the one
# independent measurement of copy-heavy turns (turboderp-org/exllamav3#374: n-gram drafts chained
# after an MTP-4 head, +112..136% on "return the complete updated file with these nine edits"):
# with MTP-4 at 2.5..3 tokens per step outside copies and 12+ inside, the measured gain needs
# 69..73% of the output to be copied (docs/twin.md, "NGRAM").
COPY_SHARE = 0.7

# A last user turn that asks for earlier text back, changed (the twin's own reading, like the
# domain rules in domain.py).
_REWRITE = re.compile(
    r"\b(rewrite|re-write|revise|edit|refactor|modify|update|fix|change|rename|reformat|"
    r"apply (the|these|this)|return the (complete|full|whole|entire|updated)|repeat|again|"
    r"same (code|answer|text|file)|keep (the rest|everything else))\b",
    re.IGNORECASE,
)


def fingerprints(text: str) -> list[int]:
    """Hashes of the text's consecutive BLOCK_WORDS-word blocks from its first word (a trailing
    partial block is dropped). Whitespace is not part of a word: a client that trims or re-wraps
    the text it sends back still matches."""
    words = text.split()
    out: list[int] = []
    for start in range(0, len(words) - BLOCK_WORDS + 1, BLOCK_WORDS):
        block = "\x1f".join(words[start : start + BLOCK_WORDS]).encode()
        out.append(int.from_bytes(hashlib.blake2b(block, digest_size=8).digest(), "little"))
    return out


def rewrite_intent(text: str) -> bool:
    return _REWRITE.search(text) is not None


def copy_source(turns: Sequence[tuple[str, str]]) -> str | None:
    """The text a chat turn would copy: the latest assistant message before a last user turn that
    asks to rewrite, edit or repeat it; None otherwise."""
    if not turns or turns[-1][0] != "user" or not rewrite_intent(turns[-1][1]):
        return None
    for role, content in reversed(turns[:-1]):
        if role == "assistant" and content.strip():
            return content
    return None


def echo_share(recalled: float, answer_tokens: int, output_tokens: int, copy_share: float = COPY_SHARE) -> float:
    """The share of a request's output that repeats text still in the server's trie: the copied
    share of its answer, times how much of the copy source the server remembers, diluted by the
    tokens it writes before the answer (reasoning)."""
    if output_tokens <= 0 or answer_tokens <= 0:
        return 0.0
    answer_share = min(1.0, answer_tokens / output_tokens)
    return max(0.0, min(1.0, copy_share * recalled * answer_share))


def copy_step_share(echo: float, tokens_in_copy: float, tokens_elsewhere: float) -> float:
    """The share of verify passes spent inside copies when a fraction `echo` of the output is
    copied: passes emit `tokens_in_copy` tokens there and `tokens_elsewhere` outside."""
    if echo <= 0.0:
        return 0.0
    if echo >= 1.0:
        return 1.0
    inside = echo / tokens_in_copy
    return inside / (inside + (1.0 - echo) / tokens_elsewhere)


class NgramMemory:
    """What a server's trie still holds: fingerprints of its answers and the keys of the greedy
    prompts it answered, for its last `horizon_tokens` generated tokens. Bounded: an entry older
    than the horizon is dropped (at most one entry per BLOCK_WORDS generated tokens plus one per
    request)."""

    __slots__ = ("horizon_tokens", "_generated", "_blocks", "_prompts")

    def __init__(self, horizon_tokens: int) -> None:
        if horizon_tokens < 1:
            raise ValueError(f"horizon_tokens must be >= 1, got {horizon_tokens}")
        self.horizon_tokens = horizon_tokens
        self._generated = 0  # tokens generated by the server since start
        self._blocks: collections.OrderedDict[int, int] = collections.OrderedDict()  # block -> when
        self._prompts: collections.OrderedDict[int, int] = collections.OrderedDict()  # key -> when

    def __len__(self) -> int:
        return len(self._blocks) + len(self._prompts)

    def generated(self, tokens: int) -> None:
        """The server generated `tokens` more tokens: older text falls out of the horizon."""
        self._generated += max(0, tokens)
        oldest = self._generated - self.horizon_tokens
        for table in (self._blocks, self._prompts):
            while table and next(iter(table.values())) < oldest:
                table.popitem(last=False)

    def remember_text(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            self._blocks[b] = self._generated
            self._blocks.move_to_end(b)
        self.generated(0)

    def remember_prompt(self, key: int) -> None:
        self._prompts[key] = self._generated
        self._prompts.move_to_end(key)
        self.generated(0)

    def recall(self, blocks: Sequence[int]) -> float:
        """The share of `blocks` the server generated within its horizon (0.0 for none)."""
        if not blocks:
            return 0.0
        return sum(b in self._blocks for b in blocks) / len(blocks)

    def answered(self, key: int) -> bool:
        """Did the server answer this prompt greedily within its horizon (the same output again)?"""
        return key in self._prompts
