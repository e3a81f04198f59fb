"""The threshold policy: speculative backends while they are lightly loaded, AR beyond.

This is vLLM's disable-speculation-above-a-batch-size idea applied across servers: speculation
pays at low batch and stops paying as the verify pass grows, so a speculative backend takes
requests only while it holds fewer than `threshold` of them. It needs no telemetry but a
threshold tuned per model and machine (docs/peers.md: dense 8B models lose the gain by batch
8-32, MoE ones keep it much longer); the goodput policy learns what this one has to be told.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.base import BackendView, Decision, NoCandidate, Outcome, RequestFeatures, view_load

__all__ = ["Threshold"]


class Threshold:
    """Least-loaded speculative backend below `threshold` in flight, else least-loaded AR one.

    With no AR backend in the pool, the least-loaded backend of all takes the overflow. Ties are
    broken at random (a first-in-list tie-break sends all sequential traffic to one backend).
    """

    name = "threshold"

    def __init__(self, threshold: int = 16, *, seed: int | None = None, rng: random.Random | None = None) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        self.threshold = threshold
        self._rng = rng or random.Random(seed)

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        healthy = [c for c in candidates if c.healthy]
        if not healthy:
            raise NoCandidate("no healthy backend")
        spec = [c for c in healthy if c.spec.strategy.speculative and view_load(c) < self.threshold]
        if spec:
            pool, why = spec, f"speculative below {self.threshold}"
        else:
            ar = [c for c in healthy if not c.spec.strategy.speculative]
            pool, why = (ar, f"AR at or above {self.threshold}") if ar else (healthy, "overflow")
        low = min(view_load(c) for c in pool)
        tied = [c for c in pool if view_load(c) == low]
        chosen = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        return Decision(backend=chosen, reason=f"threshold: {why}, load {low}", score=float(low))

    def observe(self, outcome: Outcome) -> None:
        pass
