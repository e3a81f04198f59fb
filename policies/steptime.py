"""Step time of one backend as a function of its load, learned online over a prior curve.

Seconds per decode/verify pass grow with the batch, and how fast they grow is what decides when
speculation stops paying. The curve is the strategy's prior (`policies.priors.StepPrior`) times a
correction learned per load bucket (in flight 1, 2, 4, ..., 128+), linearly interpolated in
between. A bucket never observed borrows the correction of the nearest observed one (the mean of
both neighbours at equal distance), so one measurement at low load already rescales the whole
curve while the shape beyond it stays the prior's until measured. Step times are nearly
deterministic, so an observation is trusted at once (no shrinkage towards the prior).
"""

from __future__ import annotations

import math
from typing import Any

from policies.priors import StepPrior

__all__ = ["BUCKETS", "StepCurve"]

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
_TOP = len(BUCKETS) - 1
_MEMO = 512
_UNKNOWN = (0.0,) * (_MEMO + 1)


def _position(load: float) -> tuple[int, float]:
    """Bucket index and fraction towards the next bucket (linear within an octave)."""
    if load <= 1.0:
        return 0, 0.0
    if load >= BUCKETS[_TOP]:
        return _TOP, 0.0
    i = int(math.log2(load))
    return i, load / (1 << i) - 1.0


class StepCurve:
    """Predicted seconds per step at a load; O(1) lookup, O(buckets) = O(1) update."""

    __slots__ = ("prior", "_max_running", "ratio", "samples", "eff", "_alpha", "_memo")
    MEMO = _MEMO

    def __init__(self, prior: StepPrior, max_running: int, alpha: float = 0.2) -> None:
        self.prior = prior
        self._max_running = max_running
        self.ratio = [1.0] * len(BUCKETS)  # observed / prior, per bucket
        self.samples = [0.0] * len(BUCKETS)
        self.eff = [1.0] * (len(BUCKETS) + 1)  # with borrowing; spare slot for i+1 at the top
        self._alpha = alpha
        # step_s per load up to _MEMO, computed on first use since the last change: the cost
        # model asks for two loads per candidate per request, the curve changes once per outcome.
        self._memo = list(_UNKNOWN)

    @property
    def max_running(self) -> int:
        return self._max_running

    @max_running.setter
    def max_running(self, value: int) -> None:
        self._max_running = value
        self._memo[:] = _UNKNOWN

    def prior_s(self, load: float) -> float:
        b = min(max(load, 1.0), float(self._max_running))
        return self.prior.step_s(b)  # type: ignore[arg-type]

    @property
    def memo(self) -> list[float]:
        """step_s per load 0..MEMO, 0.0 where not computed since the last change (read on the
        cost model's hot path; the list object stays the same)."""
        return self._memo

    def step_s(self, load: int) -> float:
        """Seconds per pass with `load` requests in flight (beyond max_running they queue and
        the batch stays at max_running)."""
        if 0 <= load <= _MEMO:
            t = self._memo[load]
            if t:
                return t
            t = self._memo[load] = self._step_s(load)
            return t
        return self._step_s(load)

    def _step_s(self, load: int) -> float:
        cap = self._max_running
        p = self.prior
        b = load if load < cap else cap
        if b < 1:
            b = 1
        n = b * p.width
        base = p.t0_s + p.k_s * (n - 1) + p.draft0_s + p.draft1_s * (b - 1)
        if n > p.knee_tokens:
            base += p.k_compute_s * (n - p.knee_tokens)
        e = self.eff
        if load <= 1:
            return base * e[0]
        if load >= 128:
            return base * e[_TOP]
        i = load.bit_length() - 1
        f = load / (1 << i) - 1.0
        return base * (e[i] + (e[i + 1] - e[i]) * f)

    def observe(self, load: float, step_s: float, weight: float = 1.0) -> None:
        """A request that saw about `load` in flight measured `step_s` seconds per pass.

        `weight` in (0, 1] is how much of a full sample it is: a request of a few passes measures
        its step time over a few hundred milliseconds, and one prefill of someone else's long
        prompt riding in one of them multiplies it (`policies.estimates` weighs by passes)."""
        x = step_s / self.prior_s(load)
        i, f = _position(load)
        for j, w in ((i, (1.0 - f) * weight), (i + 1, f * weight)):
            if w <= 0.0 or j > _TOP:
                continue
            base = self.ratio[j] if self.samples[j] > 0 else self.eff[j]
            self.samples[j] += w
            # a whole first sample replaces the prior; a fraction of one only moves it that far
            a = max(self._alpha * w, w / max(self.samples[j], 1.0))
            # in log space: a correction is a factor (a prior 50x off, a stall of 10x in one pass)
            self.ratio[j] = base * (x / base) ** a
        self._borrow()

    def _borrow(self) -> None:
        self._memo[:] = _UNKNOWN  # in place: the cost model holds the list
        n, r, eff = self.samples, self.ratio, self.eff
        size = len(BUCKETS)
        left: list[tuple[int, float] | None] = [None] * size
        last: tuple[int, float] | None = None
        for j in range(size):
            if n[j] > 0:
                last = (j, r[j])
            left[j] = last
        last = None
        for j in range(size - 1, -1, -1):
            if n[j] > 0:
                last = (j, r[j])
            lo, hi = left[j], last
            if lo is None and hi is None:
                eff[j] = 1.0
            elif hi is None or (lo is not None and j - lo[0] < hi[0] - j):
                eff[j] = lo[1]  # type: ignore[index]
            elif lo is None or hi[0] - j < j - lo[0]:
                eff[j] = hi[1]
            else:
                eff[j] = 0.5 * (lo[1] + hi[1])
        eff[size] = eff[_TOP]

    def describe(self) -> dict[str, Any]:
        return {
            "step_ms": {str(b): round(self.step_s(b) * 1000, 2) for b in BUCKETS},
            "step_samples": {str(b): round(self.samples[k], 1) for k, b in enumerate(BUCKETS)},
        }
