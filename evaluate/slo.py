"""Latency SLOs and goodput as DistServe defines them.

A request *attains* the SLO when it completed with TTFT <= `ttft_s` and TPOT <= `tpot_s` (TPOT:
time per output token after the first, (last - first token) / (tokens - 1)). SLO attainment is the
share of the requests that *arrived* which attained it: a shed request (503 twice) or one still
unfinished at the end counts as a miss, so a policy cannot gain by refusing work. Goodput is the
rate of requests that attained the SLO (requests/s over the measured window), the quantity
DistServe (Zhong et al., OSDI 2024) maximizes; DistServe's per-GPU figure is the largest arrival
rate at which attainment stays >= 90%, which `specroute plan` searches for when asked.

`parse_slo("ttft=5,tpot=0.06")` reads the command-line form; an error names what does not parse.
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["DEFAULT_SLO", "SLO", "SloError", "parse_slo"]


class SloError(ValueError):
    pass


class SLO(msgspec.Struct, frozen=True, kw_only=True):
    ttft_s: float = 5.0
    tpot_s: float = 0.06

    def met(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        return ttft_s is not None and ttft_s <= self.ttft_s and (tpot_s is None or tpot_s <= self.tpot_s)

    @property
    def label(self) -> str:
        return f"ttft={self.ttft_s:g},tpot={self.tpot_s:g}"


# Defaults (assumptions, interactive use of a thinking model): the first token within 5 s
# (queueing plus prefill of a long history), then >= ~17 tok/s, about what an AR server of K2.6
# gives one request at moderate batch (R1/R2: 26 tok/s alone).
DEFAULT_SLO = SLO()


def parse_slo(text: str) -> SLO:
    """`ttft=S,tpot=S` (seconds; either may be left out and keeps its default)."""
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in ("ttft", "tpot"):
            raise SloError(f"SLO part {part.strip()!r} does not parse: expected ttft=SECONDS or tpot=SECONDS")
        if key in values:
            raise SloError(f"SLO gives {key} twice")
        try:
            v = float(value.strip().removesuffix("s"))
        except ValueError:
            raise SloError(f"SLO {key}={value!r}: not a number of seconds") from None
        if not v > 0 or not math.isfinite(v):
            raise SloError(f"SLO {key}={value!r}: must be a positive number of seconds")
        values[key] = v
    return SLO(ttft_s=values.get("ttft", DEFAULT_SLO.ttft_s), tpot_s=values.get("tpot", DEFAULT_SLO.tpot_s))
