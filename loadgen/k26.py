"""Kimi K2.6's request settings for replayed and generated traffic (traces, the agentic shape).

Sampling. Kimi's API fixes it for kimi-k2.6: temperature 1.0 in thinking mode, 0.6 in instant
(non-thinking) mode, top_p 0.95; other temperatures are refused (Kimi platform model overview;
Tencent TokenHub's Kimi guide states both temperatures). A replay of K2.6 traffic sends exactly
these. No public figure splits K2.6 traffic into thinking and instant requests, so the share of
thinking requests is an option, `DEFAULT_THINKING_SHARE` (0.7) unless given.

Output lengths. The public traces (Mooncake 2024, Azure 2023-2024, BurstGPT) were recorded before
thinking models; a thinking K2.6 request writes its reasoning before the answer it would have
given. A trace's output length is taken as the answer, and a thinking request's as that times
`DEFAULT_THINKING_SCALE` (3.0): OpenRouter and a16z's "State of AI" report (December 2025) found
mean completion tokens per request roughly tripled over 2025 as reasoning models passed half of
all tokens (figure read in secondary summaries of the report), and K2.6 wrote 2.1x K2.5's output
on the same coding tasks (a secondary measurement), so a 2x reasoning segment on top of the
answer is the central estimate; 2.0 and 4.0 are the sensitivity bounds worth running.

Which requests think: a low-discrepancy sequence over the request index (the golden-ratio
sequence from a seed-dependent start), so any run of requests holds the share to within a
request or two, without the clumps of independent draws, and the same seed gives the same mix.
"""

from __future__ import annotations

import math
import random

import msgspec

__all__ = [
    "DEFAULT_THINKING_SCALE",
    "DEFAULT_THINKING_SHARE",
    "INSTANT_TEMPERATURE",
    "THINKING_TEMPERATURE",
    "TOP_P",
    "K26Mode",
    "k26_mode",
    "scaled_output",
]

THINKING_TEMPERATURE = 1.0
INSTANT_TEMPERATURE = 0.6
TOP_P = 0.95
DEFAULT_THINKING_SHARE = 0.7
DEFAULT_THINKING_SCALE = 3.0
_GOLDEN = (math.sqrt(5) - 1) / 2


class K26Mode(msgspec.Struct, frozen=True):
    thinking: bool
    temperature: float
    top_p: float


def k26_mode(share: float, seed: int, index: int) -> K26Mode:
    """Request `index`'s mode when a `share` of requests think (the module docstring)."""
    start = random.Random(f"k26-mode:{seed}").random()
    thinking = (start + index * _GOLDEN) % 1.0 < share
    return K26Mode(thinking, THINKING_TEMPERATURE if thinking else INSTANT_TEMPERATURE, TOP_P)


def scaled_output(trace_tokens: int, thinking: bool, scale: float) -> int:
    """A trace's output length as K2.6 would write it: x `scale` when thinking (at least 1)."""
    return max(1, round(trace_tokens * scale)) if thinking else max(1, trace_tokens)
