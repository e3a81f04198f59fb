"""Acceptance length of one speculative backend, per prompt domain, learned online.

Tokens per verify pass depend on the drafter and on what is being written (math and code draft
better than chat). The model is level x shape[domain]:

- `shape` holds the relative acceptance of each domain; it starts at the strategy's prior and
  moves slowly, one domain's samples at a time;
- `level` is the drafter's current quality, shared by all domains and fast (EWMA weight 0.25):
  when a drafter degrades, a finished request of any domain moves every domain's prediction,
  instead of each domain waiting for its own samples;
- `drift` uses the backend's own windowed accept length (SGLang `/v1/loads`, polled): compared
  with what the model predicts for the domains in flight at that time, a ratio outside a noise
  band scales every domain at once, seconds before finished requests can say the same. The
  ratio is recomputed whenever the model learns, so it fades to 1 as outcomes catch up.

Both learning rates start at 1/(n + 2) (the prior counts as two samples) and settle at their
floor, so early data moves the estimate quickly without one unlucky prompt rewriting it.
"""

from __future__ import annotations

import math

from policies.priors import DOMAINS

__all__ = ["Acceptance"]

_LEVEL_ALPHA = 0.25
_SHAPE_ALPHA = 0.1
_PRIOR_WEIGHT = 2.0
# The report is a window of ~40 steps over the running requests, whose acceptance varies per
# prompt (~12% for one request): ratios inside the band are noise. It narrows as 1/sqrt(running).
_BAND_MANY = 0.1
_BAND_ONE = 0.3
_MAX_ACCEPT = 64.0


class Acceptance:
    """Predicted tokens per verify pass per domain index; `values` is read on the hot path."""

    __slots__ = ("prior", "values", "shape", "level", "n", "n_domain", "mix", "drift",
                 "_report", "_report_mix", "_report_running")

    def __init__(self, prior: tuple[float, ...]) -> None:
        self.prior = prior
        self.values = list(prior)  # level x shape x drift, floored at 1; mutated in place
        self.shape = list(prior)
        self.level = 1.0
        self.n = 0
        self.n_domain = [0] * len(DOMAINS)
        self.mix = [0] * len(DOMAINS)  # requests in flight per domain, as dispatched
        self.drift = 1.0
        self._report: float | None = None
        self._report_mix: list[int] | None = None
        self._report_running = 0

    def observe(self, d: int, x: float) -> None:
        """One finished request of domain `d` accepted `x` tokens per verify pass."""
        self.n += 1
        a = max(_LEVEL_ALPHA, 1.0 / (self.n + _PRIOR_WEIGHT))
        self.level *= 1.0 + a * (x / (self.level * self.shape[d]) - 1.0)
        self.n_domain[d] += 1
        b = max(_SHAPE_ALPHA, 1.0 / (self.n_domain[d] + _PRIOR_WEIGHT))
        self.shape[d] *= 1.0 + b * (x / (self.level * self.shape[d]) - 1.0)
        self._refresh()

    def note_dispatch(self, d: int) -> None:
        self.mix[d] += 1

    def note_done(self, d: int) -> None:
        if self.mix[d] > 0:
            self.mix[d] -= 1

    def note_idle(self) -> None:
        """No request of ours is in flight: forget counts left by outcomes that never came."""
        if any(self.mix):
            self.mix = [0] * len(DOMAINS)

    def note_report(self, reported: float, running: int | None) -> None:
        """The backend's windowed accept length, with the number of requests it ran. A report
        from an idle backend or with none of our requests in flight cannot be matched to a
        domain mix; it leaves the last usable one in place."""
        if (not running or running < 1 or not isinstance(reported, (int, float))
                or not math.isfinite(reported) or not 1.0 <= reported <= _MAX_ACCEPT
                or not any(self.mix)):
            return
        self._report = float(reported)
        self._report_mix = list(self.mix)
        self._report_running = running
        self._refresh()

    def _expected(self, mix: list[int]) -> float:
        total = sum(mix)
        return sum(m * self.level * s for m, s in zip(mix, self.shape)) / total if total else 0.0

    def _refresh(self) -> None:
        drift = 1.0
        if self._report is not None and self._report_mix is not None:
            expected = self._expected(self._report_mix)
            if expected > 0:
                ratio = self._report / expected
                band = max(_BAND_MANY, _BAND_ONE / math.sqrt(self._report_running))
                if abs(ratio - 1.0) > band:
                    drift = ratio
        self.drift = drift
        scale = self.level * drift
        values = self.values
        for j, s in enumerate(self.shape):
            v = s * scale
            values[j] = v if v > 1.0 else 1.0

    def describe(self) -> dict:
        return {
            "accept_length": {dom.value: round(self.values[i], 3) for i, dom in enumerate(DOMAINS)},
            "accept_samples": {dom.value: self.n_domain[i] for i, dom in enumerate(DOMAINS)},
            "accept_level": round(self.level, 3),
            "accept_drift": round(self.drift, 3),
        }
