"""Open-loop arrival processes: when the next session arrives, independent of how the last one went.

- `poisson`: exponential gaps at the phase's rate.
- `trace`: the arrival times of a recorded trace (`evaluate.sources.TraceSource`), not drawn here.
- `bursty`: a two-state Markov-modulated Poisson process (MMPP-2), the usual model of bursty
  request traffic: the rate is `burst_factor` x the mean during bursts and low enough between
  them that the long-run mean is the phase's rate. Bursts take `burst_duty` of the time; state
  holding times are exponential with a mean on+off cycle of `burst_cycle_s`.

Both are drawn from one `random.Random` seeded per (run seed, scenario, phase), so every contestant
sees the same arrival times (common random numbers).
"""

from __future__ import annotations

import math
import random

import msgspec

__all__ = ["ARRIVALS", "Arrivals", "BurstShape"]

ARRIVALS = ("closed", "poisson", "bursty", "trace")


class BurstShape(msgspec.Struct, frozen=True, kw_only=True):
    factor: float = 2.5  # rate during a burst / mean rate
    duty: float = 0.25  # share of time in bursts; factor * duty must stay below 1
    cycle_s: float = 60.0  # mean length of one burst + the quiet stretch after it


class Arrivals:
    """Arrival times of one phase, drawn lazily: `next_after(t)` -> the next arrival time > t."""

    def __init__(
        self, kind: str, rate: float, start_s: float, rng: random.Random, shape: BurstShape | None = None
    ) -> None:
        if kind not in ("poisson", "bursty"):
            raise ValueError(f"open-loop arrivals are poisson or bursty, not {kind!r}")
        if not rate > 0 or not math.isfinite(rate):
            raise ValueError(f"arrival rate must be a positive number, got {rate!r}")
        self.rng = rng
        self.mean_rate = rate
        shape = shape or BurstShape()
        if kind == "bursty":
            if not (shape.factor > 1 and 0 < shape.duty < 1 and shape.factor * shape.duty < 1 and shape.cycle_s > 0):
                raise ValueError(f"bursty arrivals need factor > 1, 0 < duty < 1, factor x duty < 1: {shape}")
            self.rates = (rate * (1 - shape.factor * shape.duty) / (1 - shape.duty), rate * shape.factor)
            self.hold = (shape.cycle_s * (1 - shape.duty), shape.cycle_s * shape.duty)  # mean holding times
        else:
            self.rates = (rate, rate)
            self.hold = (math.inf, math.inf)
        # A phase is a sample of a process that has been running: it starts in a burst with the
        # burst's share of the time, and (holding times being memoryless) a state's remaining time
        # is drawn like a whole one. Always starting quiet would carry about 5% fewer requests
        # than the rate in a 90-120 s phase of the default shape.
        self.state = 0
        self.state_until = math.inf
        if kind == "bursty":
            self.state = 1 if rng.random() < shape.duty else 0
            self.state_until = start_s + rng.expovariate(1 / self.hold[self.state])

    def next_after(self, t: float) -> float:
        """Thinning-free MMPP sampling: an exponential gap at the current state's rate, redrawn
        from the state change when the gap crosses it (memorylessness makes that exact)."""
        while True:
            gap = self.rng.expovariate(self.rates[self.state])
            if t + gap <= self.state_until:
                return t + gap
            t = self.state_until
            self.state ^= 1
            self.state_until = t + self.rng.expovariate(1 / self.hold[self.state])
