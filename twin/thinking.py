"""How long a thinking model reasons before it answers: one pure function of (model, domain, key).

The HTTP twin and a virtual-clock evaluator call the same `reasoning_tokens` with the same prompt
key, so both see the same reasoning length for the same prompt. Lengths are log-normal per
domain around a median (`[reasoning]` in a profile): math reasons longest, chat least. The
medians are assumptions (no published per-domain reasoning-length table for Kimi K2.6 was
found); the log-normal shape follows the long right tail reasoning traces show.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated

import msgspec

__all__ = ["ReasoningModel", "lognormal_tokens", "reasoning_tokens", "reasoning_uniform"]

_STD_NORMAL = NormalDist()


class ReasoningModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The server's reasoning parser and the reasoning length per domain (median tokens)."""

    parser: str = "kimi_k2"  # SGLang --reasoning-parser value
    math: Annotated[int, msgspec.Meta(ge=0)] = 0
    code: Annotated[int, msgspec.Meta(ge=0)] = 0
    chat: Annotated[int, msgspec.Meta(ge=0)] = 0
    spread: Annotated[float, msgspec.Meta(ge=0.0, le=3.0)] = 0.0  # sigma of the log-normal (0: the median)
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 32768  # cap of one reasoning segment


def reasoning_uniform(key: int) -> float:
    """A deterministic uniform in (0, 1) from a prompt key (independent of prompt_variation)."""
    mixed = (key * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    mixed ^= mixed >> 29
    return ((mixed >> 11) + 0.5) / float(1 << 53)


def reasoning_tokens(model: ReasoningModel | None, domain: str, key: int) -> int:
    """Reasoning tokens the model produces for a prompt of `domain` with prompt key `key`.

    0 when the model does not think (no `[reasoning]` table, or a zero median).
    """
    if model is None:
        return 0
    median = getattr(model, domain, 0)
    if median <= 0:
        return 0
    return min(model.max_tokens, lognormal_tokens(median, model.spread, key))


def lognormal_tokens(median: int, spread: float, key: int) -> int:
    """A length drawn from a log-normal around `median` with sigma `spread`, by prompt key: the
    same key, the same length (at least 1)."""
    z = _STD_NORMAL.inv_cdf(reasoning_uniform(key)) if spread > 0 else 0.0
    return max(1, round(median * math.exp(spread * z)))
