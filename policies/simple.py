"""Load-only policies: they ignore speculation and are the baselines the goodput policy must beat."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from policies.base import BackendView, Decision, NoCandidate, Outcome, RequestFeatures


def _healthy(candidates: Sequence[BackendView]) -> Sequence[BackendView]:
    healthy = [c for c in candidates if c.healthy]
    if not healthy:
        raise NoCandidate("no healthy backend")
    return healthy


class LeastInflight:
    """Fewest requests in flight wins; ties are broken at random.

    A deterministic tie-break (first in list) is the classic gateway bug that sends almost all
    sequential traffic to one backend.
    """

    name = "least_inflight"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        low = min(c.inflight for c in pool)
        tied = [c for c in pool if c.inflight == low]
        chosen = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        return Decision(backend=chosen, reason=f"least_inflight={low}", score=float(low))

    def observe(self, outcome: Outcome) -> None:
        pass


class RoundRobin:
    """Each healthy backend in turn, regardless of load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        chosen = pool[next(self._counter) % len(pool)]
        return Decision(backend=chosen, reason="round_robin")

    def observe(self, outcome: Outcome) -> None:
        pass


class Pinned:
    """Always the one named backend; if it is down the request fails rather than moving silently."""

    name = "pinned"

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        for c in candidates:
            if c.name == self.backend:
                if not c.healthy:
                    raise NoCandidate(f"pinned backend {self.backend!r} is unavailable")
                return Decision(backend=c, reason="pinned")
        raise NoCandidate(f"pinned backend {self.backend!r} is not in the pool")

    def observe(self, outcome: Outcome) -> None:
        pass
