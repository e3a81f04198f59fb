"""Least squares with non-negative coefficients, on relative errors: the fits' one solver.

Every cost the twin's laws add is non-negative (a step cannot get faster with more sequences), so
a coefficient the data would make negative is held at zero and the rest refitted (the active-set
method, enough for a handful of columns). Errors are relative (each row divided by its
measurement), so a 30 ms step and a 3 s prefill weigh alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

__all__ = ["Solution", "nnls_relative"]


class Solution(msgspec.Struct, frozen=True, kw_only=True):
    coef: tuple[float, ...]
    predicted: tuple[float, ...]
    relative_errors: tuple[float, ...]  # (predicted - measured) / measured, per row

    @property
    def rms(self) -> float:
        e = self.relative_errors
        return float(np.sqrt(np.mean(np.square(e)))) if e else 0.0

    @property
    def worst(self) -> float:
        return max((abs(x) for x in self.relative_errors), default=0.0)


def nnls_relative(
    rows: Sequence[Sequence[float]], measured: Sequence[float], weights: Sequence[float] | None = None
) -> Solution:
    """Coefficients c >= 0 minimising sum w_i * ((rows_i . c - y_i) / y_i)**2."""
    x = np.asarray(rows, dtype=float)
    y = np.asarray(measured, dtype=float)
    if x.ndim != 2 or len(y) != x.shape[0] or not len(y) or np.any(y <= 0):
        raise ValueError("need at least one row and positive measurements")
    w = np.sqrt(np.asarray(weights, dtype=float)) if weights is not None else np.ones(len(y))
    a = x / y[:, None] * w[:, None]
    b = w.copy()  # y / y
    free = [j for j in range(x.shape[1]) if np.any(x[:, j] != 0)]
    coef = np.zeros(x.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if np.all(sol >= 0):
            coef[:] = 0
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))  # the most negative one is held at zero
    pred = x @ coef
    return Solution(
        coef=tuple(float(c) for c in coef),
        predicted=tuple(float(p) for p in pred),
        relative_errors=tuple(float(e) for e in (pred - y) / y),
    )
