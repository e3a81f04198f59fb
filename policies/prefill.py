"""Time to first token of one backend as a function of the prompt tokens it must prefill.

TTFT = (fixed part: the first forward pass, scheduling, network) + (seconds per uncached token) x
(prompt tokens the radix cache does not hold). Both are learned per backend from finished requests
by least squares over recent outcomes, with exponential forgetting (weight `1 - alpha` per new
sample) and the prior as two pseudo-observations, at 0 tokens and at `_PRIOR_X` tokens: while every
request is short, the slope stays the prior's; long uncached prompts move it.

Only requests dispatched to an idle backend (none of ours in flight there) are learned from: on a
busy one a TTFT is mostly waiting, for a slot or behind other prompts' prefills (SGLang prefills
first come, first served, one chunked prompt at a time), which the cost model predicts from the
backend's state (`BackendView.pending_prefill`, the load) and which, learned as a constant of the
backend, would make whichever server last took a long document look seconds slower than its twin.

When the server reports its prefill counters (`policies.server_counters`), the slope is its own
measured seconds per computed token (an EWMA over windows) and TTFT only teaches the fixed part.
"""

from __future__ import annotations

import math

__all__ = ["PrefillModel"]

_PRIOR_X = 4096.0  # tokens: where the prior's second pseudo-point sits
_PRIOR_WEIGHT = 2.0
_MAX_TTFT_S = 600.0
_RATE_ALPHA = 0.2


class PrefillModel:
    """Predicted seconds from dispatch to first token, for `uncached` prompt tokens."""

    __slots__ = ("base_s", "per_token_s", "samples", "server_rate", "_alpha", "_prior", "_data")

    def __init__(self, base_s: float, per_token_s: float, alpha: float = 0.05) -> None:
        if not (0 < alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self._alpha = alpha
        self.base_s = self.per_token_s = 0.0
        self.samples = 0
        self.server_rate = 0  # windows of the server's own prefill counters seen
        self._prior = self._data = (0.0, 0.0, 0.0, 0.0, 0.0)
        self.reset(base_s, per_token_s)

    def reset(self, base_s: float, per_token_s: float) -> None:
        """Start over from a new prior (a measurement at startup replaces the strategy's guess)."""
        if not (base_s >= 0 and per_token_s >= 0 and math.isfinite(base_s + per_token_s)):
            raise ValueError(f"prefill prior must be finite and >= 0, got {base_s}, {per_token_s}")
        self.base_s, self.per_token_s = base_s, per_token_s
        # Sums (w, x, y, xx, xy) of two points, (0, base) and (_PRIOR_X, base + slope x _PRIOR_X),
        # weight _PRIOR_WEIGHT / 2 each. They do not decay: without long prompts in the data they
        # keep the slope where it was, whatever the number of short ones.
        w = _PRIOR_WEIGHT / 2
        y1 = base_s + per_token_s * _PRIOR_X
        self._prior = (2 * w, w * _PRIOR_X, w * (base_s + y1), w * _PRIOR_X * _PRIOR_X, w * _PRIOR_X * y1)
        self._data = (0.0, 0.0, 0.0, 0.0, 0.0)
        self.samples = 0
        self.server_rate = 0

    def observe_rate(self, per_token_s: float) -> None:
        """The server measured `per_token_s` seconds per computed prompt token over a window."""
        if not (math.isfinite(per_token_s) and 0 < per_token_s < 1.0):
            return
        self.server_rate += 1
        a = max(_RATE_ALPHA, 1.0 / self.server_rate)
        self.per_token_s += a * (per_token_s - self.per_token_s)
        self._fit()

    def observe(self, ttft_s: float, uncached: int) -> bool:
        """One request prefilling `uncached` tokens (and not queueing) saw `ttft_s`."""
        if not (
            isinstance(ttft_s, (int, float)) and math.isfinite(ttft_s) and 0 < ttft_s <= _MAX_TTFT_S and uncached >= 0
        ):
            return False
        keep = 1.0 - self._alpha
        x, y = float(uncached), float(ttft_s)
        dw, dx, dy, dxx, dxy = self._data
        self._data = (dw * keep + 1.0, dx * keep + x, dy * keep + y, dxx * keep + x * x, dxy * keep + x * y)
        self.samples += 1
        self._fit()
        return True

    def _fit(self) -> None:
        w, sx, sy, sxx, sxy = (a + b for a, b in zip(self._prior, self._data, strict=True))
        var = w * sxx - sx * sx
        if not self.server_rate and var > 1e-12 * w * w:
            slope = (w * sxy - sx * sy) / var
            self.per_token_s = slope if slope > 0 else 0.0
        self.base_s = max((sy - self.per_token_s * sx) / w, 0.0)

    def describe(self) -> dict[str, float | int]:
        return {
            "prefill_base_ms": round(self.base_s * 1000, 2),
            "prefill_ms_per_1k_tokens": round(self.per_token_s * 1e6, 2),
            "prefill_samples": self.samples,
            "prefill_server_windows": self.server_rate,
        }
