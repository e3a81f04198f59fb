"""Per-draft acceptance per domain, its spread over prompts, its temperature and context laws.

The twin's law (twin/engine.py `accept_prob`, twin/sampling.py): a request of domain d at
temperature T with a P-token prompt accepts each next draft with p = 1 - q, where

    q = (1 - p_d) * exp(s*u) * (1 + (f_d - 1)*T) * g(P)

u is the prompt's own offset, uniform in [-1, 1], s the prompt spread, f_d the miss-rate factor
at T=1 and g the context law; the accepted drafts a of a verify pass then follow P(a >= j) = p**j
up to the strategy's deepest run m (`Profile.max_accept_drafts`).

SGLang reports per request the verify passes and the drafts they accepted
(`sglext.spec_tokens_details`: `spec_verify_ct`, `spec_num_correct_drafts`, counted before
`max_tokens` cuts the last pass), so a request's mean accepted drafts per pass is exact. Per cell
(domain, temperature; short prompts, thinking off) the miss rate q is solved so that the mean over
the cell's requests matches the mean the law gives over u; the spread s is the one value, shared
by every cell, that makes the requests' variance within the cells what the law says (the draws'
own noise included). Then f_d from the cells at T = 0.6 and 1.0, and g(P) per context length from
the long-prompt rounds, each request against its own domain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from tools.fit.measurements import Measurements, Request

__all__ = [
    "AcceptFit",
    "Cell",
    "CopyFit",
    "PowerLaw",
    "WindowLaw",
    "fit_accept",
    "fit_copy",
    "fit_power_law",
    "fit_window_law",
    "mean_drafts",
]

_U = np.linspace(-1.0, 1.0, 41)  # quadrature over the prompt offset u
SHORT_CONTEXT = 1024  # prompts up to this many tokens count as short (no context effect)
MIN_PASSES = 5  # a request with fewer verify passes tells too little


class Cell(msgspec.Struct, frozen=True, kw_only=True):
    domain: str
    temperature: float
    requests: int
    mean_drafts: float  # accepted drafts per verify pass, mean over the requests
    miss: float  # the fitted q of the cell


class AcceptFit(msgspec.Struct, frozen=True, kw_only=True):
    max_drafts: int
    accept: dict[str, float]  # p_d at T=0, short prompts
    spread: float
    spread_measured: bool
    temperature: dict[str, float]  # f_d
    temperatures: list[float]  # the temperatures measured
    context: dict[int, float]  # g(P) per prompt length measured (relative to short prompts)
    cells: list[Cell]
    thinking_miss_ratio: dict[str, float]  # miss with thinking on / off, per domain (T=0.6)
    requests: int
    residual: float  # rms relative error of the cells' mean drafts as fitted

    def describe_domain(self, domain: str) -> str:
        cs = [c for c in self.cells if c.domain == domain and c.temperature == 0.0]
        n = sum(c.requests for c in cs)
        return f"{n} requests at T=0 (short prompts, thinking off; sglext verify passes and accepted drafts)"


def _moments(p: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """E[a] and Var[a] of the truncated geometric law at per-draft acceptance p (arrays)."""
    j = np.arange(1, m + 1)
    pj = p[..., None] ** j
    mean = pj.sum(-1)
    second = ((2 * j - 1) * pj).sum(-1)
    return mean, second - mean**2


def mean_drafts(miss: float, spread: float, m: int) -> tuple[float, float, float]:
    """Over prompts (u uniform): the mean of E[a], the variance of E[a], and the mean of Var[a]."""
    q = np.clip(miss * np.exp(spread * _U), 0.0, 1.0)
    p = np.clip(1.0 - q, 0.0, 0.999)
    mean, var = _moments(p, m)
    return float(mean.mean()), float(mean.var()), float(var.mean())


def _solve_miss(target: float, spread: float, m: int) -> float:
    """The q whose population mean of accepted drafts is `target` (bisection; mean falls as q rises)."""
    lo, hi = 1e-6, 1.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if mean_drafts(mid, spread, m)[0] > target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def _drafts(r: Request) -> float | None:
    if r.error or r.verify_ct is None or r.correct_drafts is None or r.verify_ct < MIN_PASSES:
        return None
    return r.correct_drafts / r.verify_ct


def _requests(m: Measurements, *, short: bool, thinking: bool | None = False) -> list[Request]:
    out = []
    for lv in m.levels:
        if lv.kind not in ("step", "accept", "context", "lengths"):
            continue
        for r in lv.requests:
            if _drafts(r) is None or (thinking is not None and r.thinking != thinking):
                continue
            if (r.prompt_tokens <= SHORT_CONTEXT) == short:
                out.append(r)
    return out


def _cells(reqs: Sequence[Request]) -> dict[tuple[str, float], list[Request]]:
    cells: dict[tuple[str, float], list[Request]] = {}
    for r in reqs:
        cells.setdefault((r.domain, round(r.temperature, 3)), []).append(r)
    return cells


def _spread(cells: dict[tuple[str, float], list[Request]], m: int) -> tuple[float, bool]:
    """The prompt spread that makes the within-cell variances what the law predicts."""
    usable = {k: v for k, v in cells.items() if len(v) >= 4}
    if not usable:
        return 0.0, False
    best, best_err = 0.0, math.inf
    for s in np.linspace(0.0, 1.0, 51):
        err = 0.0
        for rs in usable.values():
            xs = np.array([_drafts(r) for r in rs], dtype=float)
            q = _solve_miss(float(xs.mean()), float(s), m)
            _, between, within = mean_drafts(q, float(s), m)
            noise = within * float(np.mean([1.0 / (r.verify_ct or 1) for r in rs]))
            predicted = between + noise
            err += len(rs) * (float(xs.var(ddof=1)) / predicted - 1.0) ** 2 if predicted > 0 else 0.0
        if err < best_err:
            best, best_err = float(s), err
    return best, True


def _context_factor(reqs: Sequence[Request], base: dict[str, float], spread: float, m: int) -> float:
    """g such that the requests' mean accepted drafts is the law's with every domain's q times g."""
    target = float(np.mean([_drafts(r) for r in reqs]))
    lo, hi = 0.05, 50.0
    for _ in range(60):
        g = math.sqrt(lo * hi)
        got = float(np.mean([mean_drafts(min(base[r.domain] * g, 1.0), spread, m)[0] for r in reqs]))
        if got > target:
            lo = g
        else:
            hi = g
    return math.sqrt(lo * hi)


def fit_accept(m: Measurements, max_drafts: int) -> AcceptFit:
    """Raises ValueError when a domain has no usable request at T=0."""
    short = _requests(m, short=True)
    cells = _cells(short)
    spread, measured = _spread(cells, max_drafts)
    fitted: list[Cell] = []
    miss: dict[tuple[str, float], float] = {}
    errors = []
    for (d, t), rs in sorted(cells.items()):
        target = float(np.mean([_drafts(r) for r in rs]))
        q = _solve_miss(target, spread, max_drafts)
        miss[(d, t)] = q
        errors.append(mean_drafts(q, spread, max_drafts)[0] / target - 1.0 if target > 0 else 0.0)
        fitted.append(Cell(domain=d, temperature=t, requests=len(rs), mean_drafts=target, miss=q))
    missing = [d for d in ("math", "code", "chat") if (d, 0.0) not in miss]
    if missing:
        raise ValueError(f"no request with speculation details at temperature 0 for {', '.join(missing)}")
    base = {d: miss[(d, 0.0)] for d in ("math", "code", "chat")}
    temps = sorted({t for (_, t) in miss if t > 0})
    factor: dict[str, float] = {}
    for d in base:
        pts = [(t, miss[(d, t)] / base[d]) for t in temps if (d, t) in miss]
        if pts:
            factor[d] = 1.0 + sum(t * (r - 1.0) for t, r in pts) / sum(t * t for t, _ in pts)
    context: dict[int, float] = {}
    by_len: dict[int, list[Request]] = {}
    for r in _requests(m, short=False):
        if r.temperature == 0.0:
            by_len.setdefault(_band(r.prompt_tokens), []).append(r)
    for length, rs in sorted(by_len.items()):
        if len(rs) >= 2:
            context[length] = _context_factor(rs, base, spread, max_drafts)
    thinking: dict[str, float] = {}
    on = _cells(_requests(m, short=True, thinking=True))
    for (d, t), rs in on.items():
        if (d, t) in miss and len(rs) >= 2:
            q_on = _solve_miss(float(np.mean([_drafts(r) for r in rs])), spread, max_drafts)
            thinking[d] = q_on / miss[(d, t)]
    return AcceptFit(
        max_drafts=max_drafts,
        accept={d: 1.0 - q for d, q in base.items()},
        spread=spread,
        spread_measured=measured,
        temperature=factor,
        temperatures=temps,
        context=context,
        cells=fitted,
        thinking_miss_ratio=thinking,
        requests=len(short),
        residual=float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0,
    )


def _band(tokens: int) -> int:
    """A prompt's length rounded to its round's target (two significant figures)."""
    if tokens <= 0:
        return 0
    digits = math.floor(math.log10(tokens)) - 1
    return int(round(tokens, -digits))


class WindowLaw(msgspec.Struct, frozen=True, kw_only=True):
    """g(P) = 1 + per_doubling * log2(P / window) beyond the window, 1 within (twin/sampling.py)."""

    window: int
    per_doubling: float
    window_reported: bool  # the server reported its draft window (`speculative_draft_window_size`)
    rms: float  # of g over the measured lengths


def _hinge(xs: list[float], ys: list[float], lowest: float, fixed: float | None = None) -> tuple[float, float, float]:
    """(x0, d, sse) of y = d * max(0, x - x0), d >= 0, x0 >= lowest, by least squares; x0 anywhere
    between the points, not only at one (with `fixed`, x0 is given)."""

    def slope(x0: float) -> tuple[float, float]:
        num = sum((x - x0) * y for x, y in zip(xs, ys, strict=True) if x > x0)
        den = sum((x - x0) ** 2 for x in xs if x > x0)
        d = max(0.0, num / den) if den > 0 else 0.0
        return d, sum((y - d * max(0.0, x - x0)) ** 2 for x, y in zip(xs, ys, strict=True))

    if fixed is not None:
        d, sse = slope(fixed)
        return fixed, d, sse
    edges = sorted({lowest, *(x for x in xs if x > lowest)})
    candidates = list(edges)
    for k in range(len(edges)):
        # with the points above edges[k] rising: y = d*x + c, x0 = -c/d, kept if it falls in its interval
        above = [(x, y) for x, y in zip(xs, ys, strict=True) if x > edges[k]]
        if len(above) >= 2:
            mx = sum(x for x, _ in above) / len(above)
            my = sum(y for _, y in above) / len(above)
            sxx = sum((x - mx) ** 2 for x, _ in above)
            d = sum((x - mx) * (y - my) for x, y in above) / sxx if sxx > 0 else 0.0
            if d > 0:
                x0 = mx - my / d
                hi = edges[k + 1] if k + 1 < len(edges) else max(xs)
                if edges[k] <= x0 <= hi:
                    candidates.append(x0)
    best = min(((x0, *slope(x0)) for x0 in candidates), key=lambda t: t[2])
    return best


def fit_window_law(context: dict[int, float], reported_window: int | None) -> WindowLaw | None:
    """The window law through the context factors (None: no long-context point)."""
    if not context:
        return None
    pts = sorted(context.items())
    xs, ys = [math.log2(p) for p, _ in pts], [g - 1.0 for _, g in pts]
    fixed = math.log2(reported_window) if reported_window else None
    x0, d, sse = _hinge(xs, ys, math.log2(SHORT_CONTEXT), fixed)
    return WindowLaw(
        window=round(2**x0), per_doubling=d, window_reported=bool(reported_window), rms=math.sqrt(sse / len(pts))
    )


class PowerLaw(msgspec.Struct, frozen=True, kw_only=True):
    """g(P) = (P / trained) ** exponent beyond `trained`, 1 within (twin/sampling.py): a drafter that
    attends to the whole context and was trained on sequences of about `trained` tokens."""

    trained: int
    exponent: float
    rms: float


def fit_power_law(context: dict[int, float]) -> PowerLaw | None:
    """The power law through the context factors (None: no long-context point)."""
    if not context:
        return None
    pts = [(p, g) for p, g in sorted(context.items()) if g > 0]
    if not pts:
        return None
    x0, e, _ = _hinge([math.log(p) for p, _ in pts], [math.log(g) for _, g in pts], math.log(SHORT_CONTEXT))
    trained = round(math.exp(x0))
    sse = sum((((p / trained) ** e if p > trained else 1.0) - g) ** 2 for p, g in pts)
    return PowerLaw(trained=trained, exponent=e, rms=math.sqrt(sse / len(pts)))


class CopyFit(msgspec.Struct, frozen=True, kw_only=True):
    """NGRAM: per-draft acceptance inside output that repeats the server's own earlier output."""

    accept: float
    requests: int
    mean_drafts: float


def fit_copy(m: Measurements, max_drafts: int) -> CopyFit | None:
    """From the rounds that repeat an earlier greedy round's prompts (None: none ran). A repeat
    regenerates the text the server just generated, so every pass drafts from its trie: no prompt
    spread (the draft is the server's own earlier answer, whatever the prompt)."""
    xs = [d for lv in m.levels if lv.kind == "copy" for r in lv.requests if (d := _drafts(r)) is not None]
    if not xs:
        return None
    target = float(np.mean(xs))
    return CopyFit(accept=1.0 - _solve_miss(target, 0.0, max_drafts), requests=len(xs), mean_drafts=target)
