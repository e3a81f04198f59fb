"""Acceptance length of one speculative backend, per acceptance cell, learned online.

Tokens per verify pass depend on the drafter, on what is being written (math and code draft
better than chat), on the temperature the target samples at and on whether the context exceeds
the drafter's window, and an NGRAM server drafts a copy of its own earlier text from its trie. A
cell is (domain, temperature band, context band, copy), `policies.priors.cell_of`.
The model is level x shape[cell]:

- `shape` holds the relative acceptance of each cell. It is a property of the drafting method
  (how much worse chat drafts than math, what sampling at T=1 costs), not of one server, so it is
  shared by every backend of one strategy (`ShapeGroup`) and learned from all their outcomes. Kept
  per backend, 18 cells learned from a few requests each made identical servers disagree by
  10-20% per cell, and the policy sent conversations away from the server holding their history
  on that noise;
- `level` is this backend's drafter quality (its budget, its hardware, a degradation). One
  request's acceptance varies by ~15% with its prompt, so the level is a slow average (EWMA
  0.04, weighed by the request's verify passes) while it agrees with a fast one (0.25); when the
  two part by more than their noise (`_SNAP`), the fast one is taken: a drafter that degrades
  moves every cell within a few requests, an unlucky prompt does not;
- `drift` uses the backend's own windowed accept length (SGLang `/v1/loads`, polled): compared
  with what the model predicts for the cells in flight at that time, a ratio outside a noise
  band scales every cell at once, seconds before finished requests can say the same. The
  ratio is recomputed whenever the model learns, so it fades to 1 as outcomes catch up.

The learning rates start at 1/(n + 2) (the prior counts as two samples) and settle at their
floors, so early data moves the estimate quickly without one unlucky prompt rewriting it.
"""

from __future__ import annotations

import math
from typing import Any

from policies.priors import CELLS_PER_DOMAIN, DOMAINS

__all__ = ["Acceptance", "ShapeGroup"]

_FAST_ALPHA = 0.25
_SLOW_ALPHA = 0.04
# |fast / slow - 1| beyond this is a change, not noise: the fast EWMA of a ~15% per-request spread
# has a ~6% standard deviation, so 3 of them
_SNAP = 0.18
_SHAPE_ALPHA = 0.05
_FULL_SAMPLE_PASSES = 32  # a request of this many verify passes or more is a whole sample
_PRIOR_WEIGHT = 2.0
# The report is a window of ~40 steps over the running requests, whose acceptance varies per
# prompt (~12% for one request): ratios inside the band are noise. It narrows as 1/sqrt(running).
_BAND_MANY = 0.1
_BAND_ONE = 0.3
_MAX_ACCEPT = 64.0


class ShapeGroup:
    """The relative acceptance per cell shared by the backends of one strategy."""

    __slots__ = ("prior", "shape", "n_cell", "members", "seeded")

    def __init__(self, prior: tuple[float, ...]) -> None:
        if len(prior) == len(DOMAINS):
            prior = tuple(a for a in prior for _ in range(CELLS_PER_DOMAIN))
        self.prior = prior
        self.shape = list(prior)
        self.n_cell = [0.0] * len(prior)
        self.members: list[Acceptance] = []
        self.seeded = False

    def observe(self, c: int, ratio: float, weight: float) -> None:
        """A request of cell `c` accepted `ratio` times what its backend's level x shape predicted."""
        self.n_cell[c] += weight
        b = max(_SHAPE_ALPHA, 1.0 / (self.n_cell[c] + _PRIOR_WEIGHT)) * weight
        self.shape[c] *= 1.0 + b * (ratio - 1.0)
        for m in self.members:
            m._refresh()


class Acceptance:
    """Predicted tokens per verify pass per cell (`cells`) and per domain at temperature 0 with a
    short context (`values`, the figure reports and the speedup baseline use); both are read on
    the hot path and updated in place."""

    __slots__ = (
        "prior",
        "group",
        "cells",
        "values",
        "level",
        "fast",
        "tracking",
        "n",
        "mix",
        "drift",
        "_report",
        "_report_mix",
        "_report_running",
    )

    def __init__(self, prior: tuple[float, ...], group: ShapeGroup | None = None) -> None:
        """`prior`: one figure per cell, or one per domain (then every cell of a domain starts alike).
        `group`: the shape shared with the other backends of this strategy (default: its own)."""
        self.group = group if group is not None else ShapeGroup(prior)
        self.group.members.append(self)
        self.prior = self.group.prior
        self.cells = list(self.prior)  # level x shape x drift, floored at 1; mutated in place
        self.values = [self.prior[d * CELLS_PER_DOMAIN] for d in range(len(DOMAINS))]
        self.level = 1.0
        self.fast = 1.0
        self.tracking = False
        self.n = 0.0
        self.mix = [0] * len(self.prior)  # requests in flight per cell, as dispatched
        self.drift = 1.0
        self._report: float | None = None
        self._report_mix: list[int] | None = None
        self._report_running = 0
        self._refresh()

    @property
    def shape(self) -> list[float]:
        return self.group.shape

    def observe(self, c: int, x: float, passes: int | None = None) -> None:
        """One finished request of cell `c` accepted `x` tokens per verify pass over `passes`
        passes (None: a whole sample)."""
        w = 1.0 if passes is None else min(1.0, passes / _FULL_SAMPLE_PASSES)
        if w <= 0:
            return
        self.n += w
        warm = 1.0 / (self.n + _PRIOR_WEIGHT)
        shape = self.group.shape[c]
        self.fast *= 1.0 + max(_FAST_ALPHA, warm) * w * (x / (self.fast * shape) - 1.0)
        self.level *= 1.0 + max(_SLOW_ALPHA, warm) * w * (x / (self.level * shape) - 1.0)
        if self.tracking or abs(self.fast / self.level - 1.0) > _SNAP:
            # a change: follow the fast average until it settles (moves by < 2% a request)
            self.tracking = abs(self.fast / self.level - 1.0) > 0.02
            self.level = self.fast
        self.group.observe(c, x / (self.level * shape), w)  # refreshes every member, this one too

    def seed(self, measured: dict[int, float]) -> None:
        """Replace the prior by a measurement: `measured` maps a domain index to its tokens per
        verify pass at temperature 0, short context. The level becomes the measurement's mean
        ratio to the prior. The first backend of a strategy measured also gives the shared shape
        its domain ratios (temperature and context factors keep the prior's)."""
        usable = {
            d: x
            for d, x in measured.items()
            if 0 <= d < len(DOMAINS) and isinstance(x, (int, float)) and math.isfinite(x) and 1.0 <= x <= _MAX_ACCEPT
        }
        if not usable:
            return
        ratios = {d: x / self.prior[d * CELLS_PER_DOMAIN] for d, x in usable.items()}
        level = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
        g = self.group
        if not g.seeded:
            g.seeded = True
            for d, r in ratios.items():
                for j in range(d * CELLS_PER_DOMAIN, (d + 1) * CELLS_PER_DOMAIN):
                    g.shape[j] = g.prior[j] * r / level
        self.level = self.fast = level
        self.n = max(self.n, float(len(usable)))
        for m in g.members:
            m._refresh()

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
        if (
            not running
            or running < 1
            or not isinstance(reported, (int, float))
            or not math.isfinite(reported)
            or not 1.0 <= reported <= _MAX_ACCEPT
            or not any(self.mix)
        ):
            return
        self._report = float(reported)
        self._report_mix = list(self.mix)
        self._report_running = running
        self._refresh()

    def _expected(self, mix: list[int]) -> float:
        total = sum(mix)
        level = self.level
        return sum(m * level * s for m, s in zip(mix, self.group.shape, strict=True)) / total if total else 0.0

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
        for j, s in enumerate(self.group.shape):
            v = s * scale
            cells[j] = v if v > 1.0 else 1.0
        values = self.values
        for d in range(len(values)):
            values[d] = cells[d * CELLS_PER_DOMAIN]

    def describe(self) -> dict[str, Any]:
        n_cell = self.group.n_cell
        per_domain = [sum(n_cell[d * CELLS_PER_DOMAIN : (d + 1) * CELLS_PER_DOMAIN]) for d in range(len(DOMAINS))]
        return {
            "accept_length": {dom.value: round(self.values[i], 3) for i, dom in enumerate(DOMAINS)},
            "accept_length_cells": [round(v, 3) for v in self.cells],
            "accept_samples": round(self.n, 1),
            "accept_shape_samples": {dom.value: round(per_domain[i], 1) for i, dom in enumerate(DOMAINS)},
            "accept_level": round(self.level, 3),
            "accept_drift": round(self.drift, 3),
        }
