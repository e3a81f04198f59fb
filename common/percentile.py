"""Percentiles, one definition for the whole project: linear interpolation between the closest
ranks, q in [0, 100] (numpy's default, "linear"), so loadgen, the evaluator and the bench agree on
what a p99 is. An empty sample has no percentile: None, and each caller says what it shows instead."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["percentile", "weighted_percentile"]


def _check(q: float) -> None:
    if not 0.0 <= q <= 100.0:  # also rejects NaN
        raise ValueError(f"percentile q must be within [0, 100], got {q!r}")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile of `values` (any order); None when there are none."""
    _check(q)
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def weighted_percentile(pairs: Iterable[tuple[float, int]], q: float) -> float | None:
    """`percentile` of the sample in which each (value, count) pair stands for `count` copies of
    `value`, computed without expanding it (a long load run pools millions of token gaps)."""
    _check(q)
    s = sorted(p for p in pairs if p[1] > 0)
    n = sum(c for _, c in s)
    if n == 0:
        return None
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    lo_v: float | None = None
    hi_v: float | None = None
    seen = 0
    for v, c in s:
        if lo_v is None and lo < seen + c:
            lo_v = v
        if lo + 1 < seen + c:
            hi_v = v
            break
        seen += c
    assert lo_v is not None  # lo <= n - 1, so some pair covers rank lo
    hi_v = s[-1][0] if hi_v is None else hi_v
    return lo_v + (hi_v - lo_v) * (pos - lo)
