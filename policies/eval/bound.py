"""How fast the average request of a phase could be at best: the ceiling a routing policy works under.

The latency target compares mean request tok/s with least_inflight's. In a closed loop that mean
is over *completed* requests, so a backend holding n requests at per-request speed r contributes
n * r completions per unit of work and the phase mean is sum(n_b r_b^2) / sum(n_b r_b) over the
backends. Two figures per phase, from the twin's true rates (the clairvoyant reference's
`OracleModel`: true acceptance per domain, true step time per load), searched exhaustively over
every split of the phase's C clients over the pool:

- `best_split`: the best fixed split when every backend sees the phase's domain mix (a backend's
  speed is the mix's mean). A policy holding that split gets about this; it is what the pool can
  give the average request when routing ignores the domain.
- `relaxed_bound`: the same search with every request running at its fastest domain's speed (for a
  one-domain phase that is the domain itself). No policy can beat it in steady state: routing can
  move requests between backends but cannot make a chat prompt accept like a math prompt.

Why a search over fixed splits bounds moving policies too: whatever a policy does, the phase mean is
E[sum n r^2] / E[sum n r] over the load vectors it visits, and in every vector sum n r^2 <= M sum n r
with M the best vector's ratio, so the mean is at most M.

Both are steady-state figures: they ignore prefill time and per-prompt acceptance spread (which
favour every policy alike, a few percent), so a measured mean can exceed `best_split` slightly.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import msgspec

from backends.sim.engine import Engine
from policies.eval.oracle import OracleModel
from policies.eval.scenarios import Phase
from policies.priors import DOMAINS

__all__ = ["PhaseCeiling", "phase_ceiling"]


class PhaseCeiling(msgspec.Struct, kw_only=True):
    best_split_request_tok_s: float
    best_split: dict[str, int]  # backend -> clients
    relaxed_bound_request_tok_s: float


def _splits(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _splits(total - first, parts - 1):
            yield (first, *rest)


def _best(speeds: Sequence[Sequence[float]], clients: int) -> tuple[float, tuple[int, ...]]:
    """Max over splits of sum(n r(n)^2) / sum(n r(n)); speeds[b][n] = per-request tok/s at load n."""
    best, arg = 0.0, (clients,) + (0,) * (len(speeds) - 1)
    for split in _splits(clients, len(speeds)):
        num = den = 0.0
        for b, n in enumerate(split):
            if n:
                r = speeds[b][n]
                num += n * r * r
                den += n * r
        if den > 0 and num / den > best:
            best, arg = num / den, split
    return best, arg


def phase_ceiling(engines: dict[str, Engine], phase: Phase) -> PhaseCeiling:
    models = [OracleModel(name, engine) for name, engine in engines.items()]
    total = sum(phase.domains.values())
    weights = [(i, phase.domains[d.value] / total) for i, d in enumerate(DOMAINS) if d.value in phase.domains]
    loads = range(phase.concurrency + 1)
    mix = [[0.0] + [sum(w * m.rate(i, n) for i, w in weights) for n in loads[1:]] for m in models]
    fastest = [[0.0] + [max(m.rate(i, n) for i, _ in weights) for n in loads[1:]] for m in models]
    value, split = _best(mix, phase.concurrency)
    bound, _ = _best(fastest, phase.concurrency)
    return PhaseCeiling(best_split_request_tok_s=value,
                        best_split={m.name: n for m, n in zip(models, split) if n},
                        relaxed_bound_request_tok_s=bound)
