"""Prefill time against prompt length, from the prefill rounds (one request alone, `max_tokens` 1).

The twin's law (twin/engine.py `prefill_time`) for n new tokens alone, chunked into steps of at most
MAX_PREFILL_TOKENS, each a forward pass of its own:

    t = base * chunks(n) + per_token * n + pair * n**2 / 2

(the last term: attention's causal (query, key) pairs). Each prefill round is a point: the server's
prefill counters (busy time over the round, SGLang 0.5.23), or the request's TTFT when the server
keeps none (then the HTTP round trip is inside `base`).
"""

from __future__ import annotations

import math

import msgspec

from tools.fit.measurements import Measurements
from tools.fit.regress import nnls_relative
from twin.engine import MAX_PREFILL_TOKENS

__all__ = ["PrefillFit", "PrefillPoint", "fit_prefill"]


class PrefillPoint(msgspec.Struct, frozen=True, kw_only=True):
    tokens: int
    seconds: float


class PrefillFit(msgspec.Struct, frozen=True, kw_only=True):
    base_ms: float
    per_token_ms: float
    attn_ms_per_mpair: float
    source: str  # "prefill counters" | "TTFT"
    points: list[PrefillPoint]
    rms: float
    worst: float
    predicted_s: list[float]

    def describe(self) -> str:
        lengths = sorted({p.tokens for p in self.points})
        return (
            f"{len(self.points)} prefills alone of {lengths[0]:,}..{lengths[-1]:,} tokens ({self.source}); "
            f"rms error {100 * self.rms:.1f}%, worst {100 * self.worst:.1f}%"
        )


def _points(m: Measurements) -> tuple[list[PrefillPoint], str]:
    counted = [lv for lv in m.levels if lv.kind == "prefill" and lv.prefill_busy_s and lv.prefill_tokens]
    if counted:
        return [PrefillPoint(tokens=lv.prefill_tokens or 0, seconds=lv.prefill_busy_s or 0.0) for lv in counted], (
            "prefill counters"
        )
    pts = [
        PrefillPoint(tokens=r.prompt_tokens - (r.cached_tokens or 0), seconds=r.ttft_s)
        for lv in m.levels
        if lv.kind == "prefill"
        for r in lv.requests
        if r.ttft_s and r.prompt_tokens and not r.error
    ]
    return pts, "TTFT"


def fit_prefill(m: Measurements) -> PrefillFit:
    """Raises ValueError when there are too few prefill points."""
    pts, source = _points(m)
    if len({p.tokens for p in pts}) < 3:
        raise ValueError(f"prefills of {len({p.tokens for p in pts})} prompt length(s): at least 3 needed")
    rows = [[float(math.ceil(p.tokens / MAX_PREFILL_TOKENS)), float(p.tokens), p.tokens**2 / 2 / 1e6] for p in pts]
    sol = nnls_relative(rows, [1000.0 * p.seconds for p in pts])
    c = sol.coef
    return PrefillFit(
        base_ms=c[0],
        per_token_ms=c[1],
        attn_ms_per_mpair=c[2],
        source=source,
        points=pts,
        rms=sol.rms,
        worst=sol.worst,
        predicted_s=[x / 1000.0 for x in sol.predicted],
    )
