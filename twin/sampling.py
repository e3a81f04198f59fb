"""How sampling settings and context length change per-draft acceptance (pure functions).

Each effect scales a prompt's per-depth *miss* rate (1 - p), the same lever the per-prompt
variation uses, so they compose multiplicatively and p never leaves (0, 1).

Temperature. A profile's `[temperature]` table states, per domain, the factor on the miss rate
at T=1 (its sources are in the profile: for DFlash the DDTree paper's T=0 / T=1 table inverted
through the truncated geometric law, for EAGLE-3 a published EAGLE-3 card). Between T=0 and T=1
the factor is interpolated linearly; above 1 (SGLang accepts up to 2) it is extrapolated
linearly (an assumption). `top_p` < 1 truncates the sampled distribution's tail, pulling it
toward greedy: the twin scales the temperature effect by top_p (an assumption; no published
table separates it).

Context. Two laws, one per kind of drafter:
- a drafter that sees only the last `draft_window_tokens` tokens (DFlash's
  `--speculative-draft-window-size`) loses little beyond the window: the miss rate grows by
  `window_miss_per_doubling` per doubling of the context past it;
- a drafter trained on sequences of `train_context_tokens` and attending to the whole context
  (an EAGLE-3 head SGLang does not window) degrades as (context / trained length) **
  `context_miss_exponent` on the miss rate.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

__all__ = [
    "MissFactor",
    "TemperatureModel",
    "context_miss_scale",
    "factor_at",
    "temperature_miss_scale",
    "window_miss_scale",
]

GREEDY_BELOW = 1e-5  # SGLang treats temperature below this as greedy (sampling_params.py)
MAX_TEMPERATURE = 2.0

MissFactor = Annotated[float, msgspec.Meta(ge=0.5, le=5.0)]


class TemperatureModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-domain miss-rate multiplier at temperature 1.0 (1.0 = no effect)."""

    math: MissFactor = 1.0
    code: MissFactor = 1.0
    chat: MissFactor = 1.0


def temperature_miss_scale(
    model: TemperatureModel | None, domain: str, temperature: float, top_p: float = 1.0
) -> float:
    """Multiplier of the miss rate at this temperature and top_p (1.0 when greedy)."""
    if model is None:
        return 1.0
    return factor_at(getattr(model, domain, 1.0), temperature, top_p)


def factor_at(at_one: float, temperature: float, top_p: float = 1.0) -> float:
    """A factor stated at T=1, at this temperature and top_p (1.0 when greedy)."""
    if temperature < GREEDY_BELOW:
        return 1.0
    t = min(temperature, MAX_TEMPERATURE) * min(max(top_p, 0.0), 1.0)
    return max(1.0 + (at_one - 1.0) * t, 0.0)


def window_miss_scale(window_tokens: int | None, per_doubling: float, context_tokens: int) -> float:
    """Multiplier of the miss rate for a context longer than the drafter's window."""
    if not window_tokens or per_doubling <= 0.0 or context_tokens <= window_tokens:
        return 1.0
    return 1.0 + per_doubling * math.log2(context_tokens / window_tokens)


def context_miss_scale(train_tokens: int | None, exponent: float, context_tokens: int) -> float:
    """Multiplier of the miss rate for a context longer than an unwindowed drafter was trained on."""
    if not train_tokens or exponent <= 0.0 or context_tokens <= train_tokens:
        return 1.0
    return float((context_tokens / train_tokens) ** exponent)
