"""Reasoning and answer lengths per domain, from the rounds that let the model end on its own.

The twin draws both from log-normals around a median per domain with one spread (twin/thinking.py,
twin/answers.py). A lengths round runs at a token budget (the sweep's time bound), so a request
still going at the budget is right-censored: its length is only known to be at least what it got.
The fit is the censored log-normal's maximum likelihood: per domain the median, one spread shared by
the domains (the twin's parameters).

Per request (`usage`: SGLang counts reasoning tokens through the end of the thinking segment):
thinking on and finished: reasoning exact, answer = completion - reasoning exact; thinking on at
the budget: reasoning censored if no answer began, else reasoning exact and the answer censored;
thinking off: the answer, exact or censored.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import msgspec

from tools.fit.measurements import Measurements

__all__ = ["LengthFit", "Sample", "fit_lengths", "length_samples"]

_N = NormalDist()


class Sample(msgspec.Struct, frozen=True):
    domain: str
    tokens: int
    censored: bool


class LengthFit(msgspec.Struct, frozen=True, kw_only=True):
    median: dict[str, int]  # per domain
    spread: float
    samples: int
    censored: int
    budget: int  # the largest token budget of the rounds

    def describe(self) -> str:
        return (
            f"{self.samples} requests ({self.censored} still running at the budget of {self.budget} tokens, "
            "censored log-normal fit)"
        )


def length_samples(m: Measurements) -> tuple[list[Sample], list[Sample], int]:
    """(reasoning samples, answer samples, largest budget) of the lengths rounds."""
    reasoning: list[Sample] = []
    answer: list[Sample] = []
    budget = 0
    for lv in m.levels:
        if lv.kind != "lengths":
            continue
        budget = max(budget, lv.max_tokens)
        for r in lv.requests:
            if r.error or r.completion_tokens <= 0 or r.finish_reason not in ("stop", "length"):
                continue
            cut = r.finish_reason == "length"
            if r.thinking:
                think = r.reasoning_tokens or 0
                content = r.completion_tokens - think
                if think <= 0:
                    continue  # no thinking segment reported (a parser that did not split it)
                if cut and content <= 1:
                    reasoning.append(Sample(r.domain, think, True))
                    continue
                reasoning.append(Sample(r.domain, think, False))
                answer.append(Sample(r.domain, max(1, content), cut))
            else:
                answer.append(Sample(r.domain, r.completion_tokens, cut))
    return reasoning, answer, budget


def _mu(xs: list[Sample], sigma: float) -> float:
    """The location maximising the censored log-likelihood at this sigma (its derivative falls in mu)."""
    logs = [math.log(s.tokens) for s in xs]
    lo, hi = min(logs) - 5 * sigma - 1, max(logs) + 10 * sigma + 5
    for _ in range(80):
        mu = (lo + hi) / 2
        grad = 0.0
        for s, x in zip(xs, logs, strict=True):
            if s.censored:
                z = (x - mu) / sigma
                tail = max(1.0 - _N.cdf(z), 1e-300)
                grad += _N.pdf(z) / (sigma * tail)
            else:
                grad += (x - mu) / sigma**2
        if grad > 0:
            lo = mu
        else:
            hi = mu
    return (lo + hi) / 2


def _loglik(xs: list[Sample], mu: float, sigma: float) -> float:
    total = 0.0
    for s in xs:
        z = (math.log(s.tokens) - mu) / sigma
        total += math.log(max(1.0 - _N.cdf(z), 1e-300)) if s.censored else -math.log(sigma) - z * z / 2
    return total


def fit_lengths(samples: list[Sample], budget: int) -> LengthFit:
    """Raises ValueError unless every domain has at least two samples, one of them finished."""
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.domain, []).append(s)
    short = [d for d in ("math", "code", "chat") if len(by.get(d, [])) < 2 or all(s.censored for s in by[d])]
    if short:
        raise ValueError(
            f"too few finished requests for {', '.join(short)} (the model did not end within the budget of "
            f"{budget} tokens)"
        )
    best: tuple[float, float, dict[str, float]] | None = None
    for i in range(1, 151):
        sigma = 0.02 * i
        mus = {d: _mu(xs, sigma) for d, xs in by.items()}
        ll = sum(_loglik(xs, mus[d], sigma) for d, xs in by.items())
        if best is None or ll > best[0]:
            best = (ll, sigma, mus)
    assert best is not None
    _, sigma, mus = best
    return LengthFit(
        median={d: max(1, round(math.exp(mus[d]))) for d in ("math", "code", "chat")},
        spread=sigma,
        samples=len(samples),
        censored=sum(s.censored for s in samples),
        budget=budget,
    )
