"""Acceptance length of one speculative backend, per acceptance cell, learned online.

Tokens per verify pass depend on the drafter, on what is being written (math and code draft
better than chat), on the temperature the target samples at and on whether the context exceeds
the drafter's window. A cell is (domain, temperature band, context band), `policies.priors.cell_of`.
The model is level x shape[cell]:

- `shape` holds the relative acceptance of each cell; it starts at the strategy's prior and
  moves slowly, one cell's samples at a time;
- `level` is the drafter's current quality, shared by all domains and fast (EWMA weight 0.25):
  when a drafter degrades, a finished request of any cell moves every cell's prediction,
  instead of each cell waiting for its own samples;
- `drift` uses the backend's own windowed accept length (SGLang `/v1/loads`, polled): compared
  with what the model predicts for the cells in flight at that time, a ratio outside a noise
  band scales every cell at once, seconds before finished requests can say the same. The
  ratio is recomputed whenever the model learns, so it fades to 1 as outcomes catch up.

Both learning rates start at 1/(n + 2) (the prior counts as two samples) and settle at their
floor, so early data moves the estimate quickly without one unlucky prompt rewriting it.
"""

from __future__ import annotations

import math
from typing import Any

from policies.priors import CELLS_PER_DOMAIN, DOMAINS

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
    """Predicted tokens per verify pass per cell (`cells`) and per domain at temperature 0 with a
    short context (`values`, the figure reports and the speedup baseline use); both are read on
    the hot path and updated in place."""

    __slots__ = ("prior", "cells", "values", "shape", "level", "n", "n_cell", "mix", "drift",
                 "_report", "_report_mix", "_report_running")

    def __init__(self, prior: tuple[float, ...]) -> None:
        """`prior`: one figure per cell, or one per domain (then every cell of a domain starts alike)."""
        if len(prior) == len(DOMAINS):
            prior = tuple(a for a in prior for _ in range(CELLS_PER_DOMAIN))
        self.prior = prior
        self.cells = list(prior)  # level x shape x drift, floored at 1; mutated in place
        self.values = [prior[d * CELLS_PER_DOMAIN] for d in range(len(DOMAINS))]
        self.shape = list(prior)
        self.level = 1.0
        self.n = 0
        self.n_cell = [0] * len(prior)
        self.mix = [0] * len(prior)  # requests in flight per cell, as dispatched
        self.drift = 1.0
        self._report: float | None = None
        self._report_mix: list[int] | None = None
        self._report_running = 0

    def observe(self, c: int, x: float) -> None:
        """One finished request of cell `c` accepted `x` tokens per verify pass."""
        self.n += 1
        a = max(_LEVEL_ALPHA, 1.0 / (self.n + _PRIOR_WEIGHT))
        self.level *= 1.0 + a * (x / (self.level * self.shape[c]) - 1.0)
        self.n_cell[c] += 1
        b = max(_SHAPE_ALPHA, 1.0 / (self.n_cell[c] + _PRIOR_WEIGHT))
        self.shape[c] *= 1.0 + b * (x / (self.level * self.shape[c]) - 1.0)
        self._refresh()

    def seed(self, measured: dict[int, float]) -> None:
        """Replace the prior by a measurement: `measured` maps a domain index to its tokens per
        verify pass at temperature 0, short context. The level becomes the measurement's mean
        ratio to the prior; each measured domain's cells move to match it exactly, the others
        follow the level; temperature and context factors keep the prior's shape."""
        usable = {d: x for d, x in measured.items()
                  if 0 <= d < len(DOMAINS) and isinstance(x, (int, float)) and math.isfinite(x)
                  and 1.0 <= x <= _MAX_ACCEPT}
        if not usable:
            return
        ratios = {d: x / self.prior[d * CELLS_PER_DOMAIN] for d, x in usable.items()}
        level = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
        self.shape = list(self.prior)
        for d, r in ratios.items():
            for j in range(d * CELLS_PER_DOMAIN, (d + 1) * CELLS_PER_DOMAIN):
                self.shape[j] *= r / level
            self.n_cell[d * CELLS_PER_DOMAIN] = max(self.n_cell[d * CELLS_PER_DOMAIN], 1)
        self.level = level
        self.n = max(self.n, len(usable))
        self._refresh()

    def note_dispatch(self, c: int) -> None:
        self.mix[c] += 1

    def note_done(self, c: int) -> None:
        if self.mix[c] > 0:
            self.mix[c] -= 1

    def note_idle(self) -> None:
        """No request of ours is in flight: forget counts left by outcomes that never came."""
        if any(self.mix):
            self.mix = [0] * len(self.mix)

    def note_report(self, reported: float, running: int | None) -> None:
        """The backend's windowed accept length, with the number of requests it ran. A report
        from an idle backend or with none of our requests in flight cannot be matched to a
        cell mix; it leaves the last usable one in place."""
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
        return sum(m * self.level * s for m, s in zip(mix, self.shape, strict=True)) / total if total else 0.0

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
        cells = self.cells
        for j, s in enumerate(self.shape):
            v = s * scale
            cells[j] = v if v > 1.0 else 1.0
        values = self.values
        for d in range(len(values)):
            values[d] = cells[d * CELLS_PER_DOMAIN]

    def describe(self) -> dict[str, Any]:
        per_domain = [sum(self.n_cell[d * CELLS_PER_DOMAIN:(d + 1) * CELLS_PER_DOMAIN]) for d in range(len(DOMAINS))]
        return {
            "accept_length": {dom.value: round(self.values[i], 3) for i, dom in enumerate(DOMAINS)},
            "accept_length_cells": [round(v, 3) for v in self.cells],
            "accept_samples": {dom.value: per_domain[i] for i, dom in enumerate(DOMAINS)},
            "accept_level": round(self.level, 3),
            "accept_drift": round(self.drift, 3),
        }
