"""How fast the average request of a phase could be at best: the ceiling a routing policy works under.

The latency target compares mean request tok/s with least_inflight's. In a closed loop that mean
is over *completed* requests, so a backend holding n requests at per-request speed r contributes
n * r completions per unit of work and the phase mean is sum(n r^2) / sum(n r) over what is in
flight. Two figures per phase, from the twin's true rates (the clairvoyant reference's
`OracleModel`: true acceptance per domain, true step time per load):

- `best_split`: the best fixed split of the phase's C clients over the pool when every backend
  sees the phase's domain mix (its speed is the mix's weighted mean), searched exhaustively. Holding
  that split gives about this.
- `bound`: what no policy can beat, fixed or moving, domain-aware or not. Whatever a policy does,
  the phase mean is E[num] / E[den] over the in-flight states it visits (num = sum n r^2, den =
  sum n r per state), and the clients' prompts fix each domain's share of completions: E[c_d] =
  w_d E[den] with c_d = sum of n r over domain-d requests. Maximizing E[num] / E[den] under those
  constraints is a linear program over distributions of states; by weak duality, for any
  multipliers lambda the largest of (num - sum_d lambda_d (c_d - w_d den)) / den over single
  states bounds it. For fixed multipliers and backend loads that expression is linear in how a
  backend's requests split over domains, so the largest is at a one-domain-per-backend state;
  that leaves a search over loads (a max-plus convolution over backends) inside a bisection on
  the ratio, and a descent over the multipliers for the tightest bound.

Both are steady-state figures: they ignore prefill time and per-prompt acceptance spread (which
favour every policy alike, a few percent), so a measured mean can exceed them slightly.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np

from evaluate.oracle import OracleModel
from evaluate.scenarios import Phase
from policies.priors import DOMAINS
from twin.engine import Engine

__all__ = ["PhaseCeiling", "best_split", "phase_ceiling", "policy_bound"]

_BISECTIONS = 40
_FIRST_STEP = 20.0  # tok/s: multipliers live on the scale of request speeds
_LAST_STEP = 0.05


class PhaseCeiling(msgspec.Struct, kw_only=True):
    best_split_request_tok_s: float
    best_split: dict[str, int]  # backend -> clients
    bound_request_tok_s: float


def _best_composition(values: np.ndarray, clients: int) -> tuple[float, list[int]]:
    """max over n_0 + ... + n_B = clients of sum_b values[b, n_b] (max-plus convolution), and the loads."""
    loads = np.arange(clients + 1)
    back = loads[:, None] - loads[None, :]  # [total, own] -> what the backends before hold
    valid = back >= 0
    best = values[0].copy()
    choices = []
    for row in values[1:]:
        cand = np.where(valid, best[np.where(valid, back, 0)] + row[None, :], -np.inf)
        own = cand.argmax(axis=1)
        choices.append(own)
        best = cand[loads, own]
    split = []
    left = clients
    for own in reversed(choices):
        split.append(int(own[left]))
        left -= int(own[left])
    split.append(left)
    return float(best[clients]), split[::-1]


def _largest_ratio(speeds: np.ndarray, gain: Callable[[float], np.ndarray]) -> tuple[float, list[int]]:
    """Dinkelbach by bisection: the largest M for which some split of the loads has a positive total
    of `gain(M)[b, n]` (one row per backend, n its load); returns M and that split."""
    clients = speeds.shape[-1] - 1
    lo, hi, split = 0.0, float(speeds.max()) * 1.01, [clients] + [0] * (len(speeds) - 1)
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        value, candidate = _best_composition(gain(mid), clients)
        if value > 1e-9:
            lo, split = mid, candidate
        else:
            hi = mid
    return hi, split


def best_split(speeds: np.ndarray, clients: int) -> tuple[float, list[int]]:
    """Max over splits of sum(n r(n)^2) / sum(n r(n)); speeds[b, n] = per-request tok/s at load n.
    The ratio exceeds M iff some split has sum n r (r - M) > 0."""
    loads = np.arange(clients + 1)
    _, split = _largest_ratio(speeds, lambda m: loads * speeds * (speeds - m))
    num = sum(n * float(speeds[b, n]) ** 2 for b, n in enumerate(split))
    den = sum(n * float(speeds[b, n]) for b, n in enumerate(split))
    return (num / den if den else 0.0), split


def _dual(speeds: np.ndarray, weights: np.ndarray, clients: int, lam: np.ndarray) -> float:
    """The bound for multipliers `lam`; speeds[b, d, n]. Each backend takes its best domain."""
    loads = np.arange(clients + 1)
    shift = float(lam @ weights)

    def gain(m: float) -> np.ndarray:
        best: np.ndarray = (loads * speeds * (speeds - lam[None, :, None] + shift - m)).max(axis=1)  # numpy: Any
        return best

    bound, _ = _largest_ratio(speeds, gain)
    return bound


def policy_bound(speeds: np.ndarray, weights: np.ndarray, clients: int) -> float:
    """The tightest dual bound found by coordinate descent on the multipliers (every multiplier
    vector gives a valid bound; the first domain's is fixed at 0, the constraints sum to zero)."""
    lam = np.zeros(len(weights))
    value = _dual(speeds, weights, clients, lam)
    step = _FIRST_STEP
    while len(weights) > 1 and step > _LAST_STEP:
        improved = False
        for k in range(1, len(weights)):
            for delta in (step, -step):
                trial = lam.copy()
                trial[k] += delta
                v = _dual(speeds, weights, clients, trial)
                if v < value - 1e-6:
                    lam, value, improved = trial, v, True
        if not improved:
            step /= 2
    return value


def phase_ceiling(engines: dict[str, Engine], phase: Phase) -> PhaseCeiling:
    models = [OracleModel(name, engine) for name, engine in engines.items()]
    total = sum(phase.domains.values())
    domains = [(i, phase.domains[d.value] / total) for i, d in enumerate(DOMAINS) if d.value in phase.domains]
    weights = np.array([w for _, w in domains])
    c = phase.concurrency
    speeds = np.zeros((len(models), len(domains), c + 1))
    for b, m in enumerate(models):
        for k, (i, _) in enumerate(domains):
            speeds[b, k, 1:] = [m.rate(i, n) for n in range(1, c + 1)]
    value, split = best_split(np.einsum("bdn,d->bn", speeds, weights), c)
    return PhaseCeiling(
        best_split_request_tok_s=value,
        best_split={m.name: n for m, n in zip(models, split, strict=False) if n},
        bound_request_tok_s=policy_bound(speeds, weights, c),
    )
