"""Decode step time against batch, verify width and KV, from the rounds' windows.

The twin's law (twin/profile.py `StepModel`) for B sequences verifying w tokens each, reading K
tokens of KV:

    t = t0 + k*(B*w - 1) + k_compute*max(0, B*w - knee) + draft(B) + kv*K

One server runs one w, so its step time is `const + per_seq*B + kv*K + knee term`: the target's
and the drafter's fixed costs add up to `const` and their per-sequence costs to `per_seq`, which
no measurement of this server separates (the profile carries them as t0 and k). Each window is a
point: the server's decode moments give its mean step time and batch (the client clock, chunks
per request over the window's span, when the server keeps no moments); KV is the mean of what the
round's requests held at the window's two ends. The knee is looked for between the measured
values of B*w and kept only when it explains the points markedly better than a straight line.
"""

from __future__ import annotations

import statistics

import msgspec

from tools.fit.measurements import Level, Measurements
from tools.fit.regress import Solution, nnls_relative

__all__ = ["StepFit", "StepPoint", "fit_step", "step_points"]

# A knee must cut the straight line's rms error by this factor (and leave it above this floor) to be
# kept: with a handful of points a knee always fits somewhat better.
STEADY = 0.9  # a window is steady when its mean batch is at least this share of the round's requests
KNEE_GAIN = 0.5
KNEE_FLOOR = 0.01
_KIND_OF_STEP = ("step", "context", "accept", "lengths")


class StepPoint(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    concurrency: int
    batch: float  # mean sequences per step
    steady: bool = True  # every step of the window ran the round's whole batch (its moments say so)
    kv_tokens: float
    step_ms: float
    steps: int
    tokens_per_verify: float | None = None  # generated tokens per sequence and step (moments)


class StepFit(msgspec.Struct, frozen=True, kw_only=True):
    width: int
    const_ms: float
    per_seq_ms: float
    per_seq_measured: bool  # False: every window ran one batch size (a cap of 1): no slope to measure
    kv_ns_per_token: float
    knee_tokens: int | None  # None: no knee up to max_tokens_per_step
    compute_ms_per_token: float
    max_tokens_per_step: int  # the largest B*w measured
    source: str  # "decode moments" | "client clock"
    points: list[StepPoint]
    rms: float
    worst: float
    predicted_ms: list[float]

    def describe(self) -> str:
        cs = sorted({p.concurrency for p in self.points})
        kv = max(p.kv_tokens for p in self.points)
        return (
            f"{len(self.points)} decode windows ({sum(p.steps for p in self.points)} steps, C={cs[0]}..{cs[-1]}, "
            f"KV up to {kv:,.0f} tokens; {self.source}); rms error {100 * self.rms:.1f}%, worst {100 * self.worst:.1f}%"
        )


def _point(level: Level) -> StepPoint | None:
    w = level.window
    if w is None:
        return None
    kv = (w.kv_start + w.kv_end) / 2
    if w.moments is not None and w.moments[0] >= 2:
        m = w.moments
        per_verify = m[5] / m[1] if m[1] > 0 else None
        batch = m[1] / m[0]
        spread = max(0.0, m[3] / m[0] - batch * batch)
        return StepPoint(
            kind=level.kind,
            concurrency=level.concurrency,
            batch=batch,
            steady=batch >= STEADY * level.concurrency and spread <= 0.25,
            kv_tokens=kv,
            step_ms=m[2] / m[0] / 1000.0,
            steps=int(m[0]),
            tokens_per_verify=per_verify,
        )
    steps = statistics.median(w.chunks) if w.chunks else 0
    if steps < 2 or w.span_s <= 0:
        return None
    return StepPoint(
        kind=level.kind,
        concurrency=level.concurrency,
        batch=float(level.concurrency),
        kv_tokens=kv,
        step_ms=1000.0 * w.span_s / steps,
        steps=int(steps),
    )


def step_points(m: Measurements) -> tuple[list[StepPoint], str]:
    """The windows' points, and where their times come from. Windows whose batch changed within
    them are left out when enough steady ones remain: a client that reads its streams late (a busy
    machine, a fast twin) sees the round's first tokens after some of its requests have finished."""
    moments = any(lv.window is not None and lv.window.moments is not None for lv in m.levels)
    pts = [
        p
        for lv in m.levels
        if lv.kind in _KIND_OF_STEP and (lv.window is not None and (lv.window.moments is not None or not moments))
        if (p := _point(lv)) is not None
    ]
    steady = [p for p in pts if p.steady]
    if len(steady) >= 3 and len({round(p.batch) for p in steady}) >= min(2, len({round(p.batch) for p in pts})):
        pts = steady
    return pts, "decode moments" if moments else "client clock"


def _solve(pts: list[StepPoint], width: int, knee: int | None, slope: bool = True) -> Solution:
    rows = []
    for p in pts:
        row = [1.0, p.batch if slope else 0.0, p.kv_tokens / 1e6]
        if knee is not None:
            row.append(max(0.0, p.batch * width - knee))
        rows.append(row)
    return nnls_relative(rows, [p.step_ms for p in pts], [min(p.steps, 50) for p in pts])


def fit_step(m: Measurements) -> StepFit:
    """Raises ValueError when there are too few windows to fit. A server whose windows all ran one
    batch size (a cap of 1) gets no slope per sequence: it never runs more."""
    width = m.facts.verify_width or 1
    pts, source = step_points(m)
    batches = {round(p.batch) for p in pts}
    if len(pts) < 2:
        raise ValueError(f"{len(pts)} decode window(s): at least 2 needed")
    slope = len(batches) >= 2
    line = _solve(pts, width, None, slope)
    best, knee = line, None
    candidates = sorted({round(p.batch * width) for p in pts})[1:-1] if slope else []
    for k in candidates:
        sol = _solve(pts, width, k)
        if sol.coef[3] > 0 and sol.rms < best.rms:
            best, knee = sol, k
    if knee is not None and not (best.rms < KNEE_GAIN * line.rms and line.rms > KNEE_FLOOR):
        best, knee = line, None
    c = best.coef
    return StepFit(
        width=width,
        const_ms=c[0],
        per_seq_ms=c[1],
        per_seq_measured=slope,
        kv_ns_per_token=c[2],  # ms per million tokens = ns per token
        knee_tokens=knee,
        compute_ms_per_token=c[3] if knee is not None else 0.0,
        max_tokens_per_step=int(max(p.batch for p in pts) * width),
        source=source,
        points=pts,
        rms=best.rms,
        worst=best.worst,
        predicted_ms=list(best.predicted),
    )
