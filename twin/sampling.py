"""How sampling settings and context length change per-draft acceptance (pure functions).

Both effects scale a prompt's per-depth *miss* rate (1 - p), the same lever the per-prompt
variation uses, so they compose multiplicatively and p never leaves (0, 1).

Temperature. The published T=0 vs T=1 tables (DDTree paper, Table 1: DFlash and DFlash+DDTree on
Qwen3-4B/8B over MATH-500, GSM8K, HumanEval, MBPP, MT-Bench, Alpaca) give the mean acceptance
length at both temperatures. Inverting the truncated geometric law the engine uses (15 drafts,
block 16) turns each pair into a miss-rate ratio; a profile's `[temperature]` table states the
ratio at T=1 per domain. Between T=0 and T=1 the ratio is interpolated linearly; above 1 (SGLang
accepts up to 2) it is extrapolated linearly (an assumption). `top_p` < 1 truncates the sampled
distribution's tail, pulling it toward greedy: the twin scales the temperature effect by top_p
(an assumption; no published table separates it).

Draft window. A DFlash drafter attends to at most the last `draft_window_tokens` tokens
(`--speculative-draft-window-size`, 4096 in the studies). Beyond it the drafter loses context
the target still sees; the twin raises the miss rate by `window_miss_per_doubling` per doubling of
the context past the window (an assumption: no published long-context acceptance table).
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["TemperatureModel", "temperature_miss_scale", "window_miss_scale"]

GREEDY_BELOW = 1e-5  # SGLang treats temperature below this as greedy (sampling_params.py)
MAX_TEMPERATURE = 2.0


class TemperatureModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-domain miss-rate multiplier at temperature 1.0 (1.0 = no effect)."""

    math: float = 1.0
    code: float = 1.0
    chat: float = 1.0


def temperature_miss_scale(
    model: TemperatureModel | None, domain: str, temperature: float, top_p: float = 1.0
) -> float:
    """Multiplier of the miss rate at this temperature and top_p (1.0 when greedy)."""
    if model is None or temperature < GREEDY_BELOW:
        return 1.0
    at_one = getattr(model, domain, 1.0)
    t = min(temperature, MAX_TEMPERATURE) * min(max(top_p, 0.0), 1.0)
    return max(1.0 + (at_one - 1.0) * t, 0.0)


def window_miss_scale(window_tokens: int | None, per_doubling: float, context_tokens: int) -> float:
    """Multiplier of the miss rate for a context longer than the drafter's window."""
    if not window_tokens or per_doubling <= 0.0 or context_tokens <= window_tokens:
        return 1.0
    return 1.0 + per_doubling * math.log2(context_tokens / window_tokens)
