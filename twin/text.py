"""Token accounting and generated text of the twin.

There is no tokenizer: one generated "token" is one short word with a leading space from a fixed
vocabulary, so a client can count tokens by counting words. Prompt tokens are approximated as
ceil(len(text) / 4) (the usual ~4 characters per token of English BPE), at least 1; chat prompts
are rendered as "role: content\\n" per message first, which stands in for the chat template.
"""

from __future__ import annotations

import random

__all__ = ["VOCAB", "TokenStream", "count_prompt_tokens", "detokenize", "render_chat"]

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an had they you were their one all we can her has there been if more when will "
    "would who so no time may out up into its then two these first any new some could only "
    "other also over than such our very make most after just well where much through back years "
    "way even because each those people how state good many must world still own see men work "
    "long here between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three sum value step answer "
    "code list node tree token batch draft verify accept model"
)
VOCAB: tuple[str, ...] = tuple(" " + w for w in _WORDS.split())


def count_prompt_tokens(text: str) -> int:
    """Approximate prompt length in tokens: ceil(chars / 4), at least 1."""
    return max(1, (len(text) + 3) // 4)


def render_chat(messages: list[tuple[str, str]]) -> str:
    """Flatten (role, content) pairs the way a chat template would, for counting and domain."""
    return "".join(f"{role}: {content}\n" for role, content in messages)


class TokenStream:
    """Deterministic words of one request: the same seed and prompt give the same text.

    Token ids are indices into VOCAB, so `output_ids` and text always agree.
    """

    __slots__ = ("_rng",)

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def take_ids(self, n: int) -> list[int]:
        """The next `n` token ids."""
        rand = self._rng.randrange
        size = len(VOCAB)
        return [rand(size) for _ in range(n)]

    def take(self, n: int) -> str:
        """The next `n` tokens as text."""
        return detokenize(self.take_ids(n))


def detokenize(ids: list[int]) -> str:
    """Text of token ids."""
    return "".join(VOCAB[i] for i in ids)
