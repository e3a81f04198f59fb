"""Prompt text for traces that carry lengths and prefix block ids but no text.

A block of a trace (Mooncake: `BLOCK_TOKENS` = 512 tokens per hash id) becomes 512 words drawn
from a fixed vocabulary by a generator seeded with the block's id, so the same id is the same
text in every request that holds it and a prefix cache hits exactly where the trace says the
prompts agree. A prompt's last block is usually partial: it is the first words of its block's
text, so a request ending inside a block shares that much with one that holds all of it. Rows
without block ids (Azure, BurstGPT) get blocks of their own (keyed by their line), shared with
nothing.

Every word is three lowercase letters after a space: four characters, which the twin counts as
one token (`twin.text.count_prompt_tokens`: a token per 4 characters), and, for the common
English words chosen, one token of a byte-level BPE vocabulary such as K2's (an approximation: a
real server's `prompt_tokens` in the records show the difference). None of the words makes the
twin's domain reader see math or code (no numbers, no arithmetic or code vocabulary), so trace
prompts read as chat, as Kimi's conversation trace is.

A block's text is a window of a fixed pool of random words (`POOL_WORDS`, 1 MB, drawn once per
process) starting at an offset hashed from the run's salt and the block's key: cutting it costs
microseconds and nothing is stored per block (a trace's blocks run to hundreds of megabytes of
text). Two blocks share text only if their offsets collide, one chance in about 260,000 per pair
that could meet at the same position of two prompts.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Sequence

from loadgen.trace_file import BLOCK_TOKENS, TraceRow

__all__ = ["POOL_WORDS", "WORDS", "PromptText"]

_WORD_TEXT = (
    "the and are but not you all any can had her was our out day get has him his how man new now old see "
    "way who boy did its let put say she too use car dog cat sun big red top end far few got law lot own "
    "set try yes yet ago air art bad bed box buy cut eat eye fit fly fun gas hit hot job key kid leg lie "
    "low map mix net oil pen pop raw row sea sit tea war win act arm ask bag bit bus cup die dry egg fan "
    "fix gap hat ice ill joy lab lay lip mad mid odd pet pie pot sad shy sky son tip toy van wet web zoo "
    "ant bat bee cow fox hen owl pig rat bay den dew elm fig fir ink jam jar jet kit log mud nut oak pad "
    "paw pin rag rib rim rod rug saw tin tub wax zip ace aid aim awe axe bid bow cab cap cod cot cub cue "
    "dam dig dim dot dug dye ear eel ego elf era eve fad fat fed fee fin fog fry fur gel gem gum gut hay "
    "hip hog hue hum hut icy inn ion jog jug keg kin lad lag lap led lid lit log mat men met mob mop mow "
    "nag nap nod nor oar oat ode opt orb ore owe pal pan pea peg pit pod pry pub pun pup ram rap ray rid "
    "rip rob rot rub rum sag sip sob sow spa spy sub tab tag tan tap tar tow tug vet vow wag wig wit woe "
    "wok yam yew"
)
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))
POOL_WORDS = 1 << 18


@functools.cache
def _pool() -> str:
    rng = random.Random("loadgen-trace-text")
    return "".join(" " + w for w in rng.choices(WORDS, k=POOL_WORDS))


class PromptText:
    """Text for trace rows; `salt` (the run's seed) changes every text, so one run's prompts
    do not hit a server cache another run filled."""

    def __init__(self, salt: str = "0") -> None:
        self.salt = salt

    @staticmethod
    def warm() -> None:
        """Draw the word pool now (a tenth of a second) rather than when the first prompt is due."""
        _pool()

    def block(self, key: str) -> str:
        """The full text of block `key` (BLOCK_TOKENS words)."""
        digest = hashlib.blake2b(f"{self.salt}:{key}".encode(), digest_size=8).digest()
        start = int.from_bytes(digest, "little") % (POOL_WORDS - BLOCK_TOKENS) * 4
        return _pool()[start : start + 4 * BLOCK_TOKENS]

    def prompt(self, row: TraceRow) -> str:
        """`row.input_tokens` words: its blocks' texts, the last one cut to what the row holds."""
        n = row.input_tokens
        count = -(-n // BLOCK_TOKENS)
        keys = [f"b{b}" for b in row.blocks] if row.blocks else [f"r{row.line}:{j}" for j in range(count)]
        return self.join(keys, n)

    def join(self, keys: Sequence[str], tokens: int) -> str:
        """`tokens` words from the blocks `keys` in order (the last one partial)."""
        parts = []
        left = tokens
        for key in keys:
            if left <= 0:
                break
            text = self.block(key)
            take = min(left, BLOCK_TOKENS)
            parts.append(text if take == BLOCK_TOKENS else text[: 4 * take])
            left -= take
        return "".join(parts)
