"""A short measurement of one backend, taken at startup, that replaces its strategy's prior.

The priors are the studies' figures; on another machine, another model or a twin with other
physics they are a head start for some backends and a handicap for others. A few requests tell
the truth about each backend before real traffic does (`tools/launch/measure.py` takes them;
`Goodput.seed` applies them): seconds per decode pass at batch 1, tokens per verify pass per
domain, and the time to first token of a short and of a long prompt (the prefill speed).
"""

from __future__ import annotations

import math

import msgspec

from policies.base import Domain

__all__ = ["Measurement"]


class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    step_s: float | None = None  # seconds per decode/verify pass, one request in flight
    accept_length: dict[Domain, float] = {}  # tokens per verify pass (bonus included), per domain, temperature 0
    prefill_base_s: float | None = None  # TTFT of an (almost) empty prompt, idle backend
    prefill_per_token_s: float | None = None  # extra TTFT per prompt token

    def problems(self) -> list[str]:
        """What is implausible about it (empty: usable)."""
        out = []
        if self.step_s is not None and not (math.isfinite(self.step_s) and 1e-5 <= self.step_s <= 60):
            out.append(f"step_s {self.step_s} outside [1e-5, 60]")
        for dom, a in self.accept_length.items():
            if not (math.isfinite(a) and 1.0 <= a <= 64.0):
                out.append(f"accept_length[{dom}] {a} outside [1, 64]")
        for name in ("prefill_base_s", "prefill_per_token_s"):
            x = getattr(self, name)
            if x is not None and not (math.isfinite(x) and 0 <= x <= 600):
                out.append(f"{name} {x} outside [0, 600]")
        return out
