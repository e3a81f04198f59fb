"""Step time and prefill speed from the counters SGLang keeps about itself, in windows.

Per-request telemetry measures a request's decode speed with everything that happened on the
server meanwhile: a 16k-token chunk of someone else's long prompt rides in one of its passes and
costs it two seconds. Averaged per backend, that makes the learned step time a record of which
prompts happened to land where, and two identical servers look 2-3x apart after a few long
documents. A policy that believes it sends the next requests to the one that looks faster, which
stays unmeasured at the loads it no longer gets (herding on noise).

SGLang 0.5.23 publishes cumulative counters in `/v1/loads` that separate the two
(`managers/scheduler.py`, `_accumulate_decode_moment` and the prefill branch beside it):

- `decode_moments`: over contiguous decode launches, the number of steps and the sums of batch
  size, step time (us), batch^2, batch x time and generated tokens. Prefill steps are not in it.
- `total_prefill_busy_us` / `total_prefill_uncached_tokens`: time spent in prefill steps and the
  prompt tokens they computed.

The difference of two reports is a window: its mean step time at its mean batch is one clean
sample of the step curve, and its busy time per computed token is the server's prefill speed.
A window closes once it holds `MIN_STEPS` decode steps (or `MIN_PREFILL_TOKENS` tokens), so that
a report after a quiet second does not count as a sample; a counter that went backwards (the
server restarted) starts a new window.
"""

from __future__ import annotations

import math

__all__ = ["MIN_PREFILL_TOKENS", "MIN_STEPS", "CounterWindows"]

MIN_STEPS = 40  # SGLang's own gauges close every 40 decode steps (decode_log_interval)
MIN_PREFILL_TOKENS = 4096
_STEPS, _BATCH, _TIME_US = 0, 1, 2


class CounterWindows:
    """One backend's last counters; `decode` and `prefill` return a closed window's figures."""

    __slots__ = ("_moments", "_prefill")

    def __init__(self) -> None:
        self._moments: tuple[float, ...] | None = None  # at the open window's start
        self._prefill: tuple[float, float] | None = None  # (busy us, tokens) at its start

    def decode(self, moments: tuple[float, ...]) -> tuple[float, float] | None:
        """(mean batch, mean seconds per step) of the decode steps since the window opened, once
        it holds MIN_STEPS steps; None while it is open or when the counters are unusable."""
        if len(moments) < 3 or not all(math.isfinite(x) for x in moments[:3]):
            return None
        start = self._moments
        if start is None or moments[_STEPS] < start[_STEPS]:
            self._moments = moments
            return None
        steps = moments[_STEPS] - start[_STEPS]
        if steps < MIN_STEPS:
            return None
        self._moments = moments
        batch = (moments[_BATCH] - start[_BATCH]) / steps
        step_s = (moments[_TIME_US] - start[_TIME_US]) / steps / 1e6
        return (batch, step_s) if batch >= 1.0 and step_s > 0 else None

    def prefill(self, busy_us: float, tokens: float) -> float | None:
        """Seconds per computed prompt token since the window opened, once it holds
        MIN_PREFILL_TOKENS tokens; None otherwise."""
        if not (math.isfinite(busy_us) and math.isfinite(tokens)):
            return None
        start = self._prefill
        if start is None or tokens < start[1] or busy_us < start[0]:
            self._prefill = (busy_us, tokens)
            return None
        n = tokens - start[1]
        if n < MIN_PREFILL_TOKENS:
            return None
        self._prefill = (busy_us, tokens)
        per_token = (busy_us - start[0]) / n / 1e6
        return per_token if per_token > 0 else None
