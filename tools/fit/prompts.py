"""The sweep's prompts: one domain each (math, code, chat), of a chosen length, never cached.

Questions are loadgen's built-in datasets, kept where the twin's domain rules read the same domain
as the dataset's label (`twin.domain.classify`): an ambiguous question would blur the domain the
fitted acceptance stands for. A long prompt is a neutral document (no numbers, no code words, so
it changes no prompt's domain) followed by the question. Every prompt starts with a word of its
own, so no two share a cached prefix on the server (SGLang's radix cache would otherwise serve
the repeats from cache and the sweep would time cache hits, not prefill).
"""

from __future__ import annotations

import functools
import random
import string

from loadgen.datasets import load_dataset
from twin.domain import DOMAINS, classify

__all__ = ["DOMAINS", "PromptMaker", "questions"]

_FILLER = (
    "The river bends slowly past the old stone mill while swallows gather on the far bank. ",
    "Along the lane the hedges are thick with bramble, and the evening light turns the fields gold. ",
    "A shepherd walks the ridge with his dog, calling now and then to the flock below. ",
    "In the village square the market stalls are folded away and the fountain murmurs on. ",
    "Clouds drift in from the west, heavy and grey, and the first drops darken the dusty road. ",
    "The library smells of old paper and polish; a clock ticks somewhere behind the shelves. ",
    "Fishing boats rock at their moorings, their ropes creaking against the weathered posts. ",
    "On the hillside the orchard is in blossom, white petals drifting over the long grass. ",
)


@functools.cache
def questions(domain: str) -> tuple[str, ...]:
    """The dataset's questions of `domain` that the twin's rules read as that domain."""
    prompts = load_dataset(domain).prompts
    return tuple(p.text for p in prompts if classify(p.text) == domain)


class PromptMaker:
    """Prompts of a domain and length. `chars_per_token` is the server's tokenizer's ratio on this
    text (measured by the sweep's first requests; 4 until then)."""

    def __init__(self, seed: int = 0, chars_per_token: float = 4.0) -> None:
        self._rng = random.Random(seed)
        self._count: dict[str, int] = {}
        self.chars_per_token = chars_per_token
        self.last_round: list[str] = []  # the prompts of the last round sent (a repeat sends them again)

    def _nonce(self) -> str:
        return "".join(self._rng.choice(string.ascii_lowercase) for _ in range(10))

    def question(self, domain: str) -> str:
        pool = questions(domain)
        if not pool:
            raise ValueError(f"no {domain} questions")
        k = self._count.get(domain, 0)
        self._count[domain] = k + 1
        return pool[k % len(pool)]

    def make(self, domain: str, prompt_tokens: int) -> str:
        """A prompt of about `prompt_tokens` tokens asking a `domain` question (a short prompt is the
        question alone)."""
        head = f"Note {self._nonce()}.\n\n"
        q = self.question(domain)
        base = len(head) + len(q)
        want = int(prompt_tokens * self.chars_per_token) - base - 80
        if want <= 0:
            return head + q
        parts: list[str] = []
        size = 0
        i = self._rng.randrange(len(_FILLER))
        while size < want:
            s = _FILLER[i % len(_FILLER)]
            parts.append(s)
            size += len(s)
            i += 1
        doc = "".join(parts)[:want]
        return f"{head}Read these notes, then answer the question after them.\n\n{doc}\n\nQuestion: {q}"
