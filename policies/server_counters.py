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
sample of the step curve, and its busy time per computed token is the server's prefill speed for
prompts as long as those of the window (attention's pairs grow with the context: the gateway's own
counts of what it had prefilled there say how long they were, `policies.prefill`).
A window closes once it holds `MIN_STEPS` decode steps (or `MIN_PREFILL_TOKENS` tokens), so that
a report after a quiet second does not count as a sample; a counter that went backwards (the
server restarted) starts a new window.
"""

from __future__ import annotations

import math

__all__ = ["MAX_PREFILL_TOKENS", "MIN_PREFILL_TOKENS", "MIN_STEPS", "CounterWindows"]

MIN_STEPS = 40  # SGLang's own gauges close every 40 decode steps (decode_log_interval)
MIN_PREFILL_TOKENS = 4096
MAX_PREFILL_TOKENS = 1 << 18  # a window waiting for a report between prompts closes anyway
_STEPS, _BATCH, _TIME_US = 0, 1, 2


class CounterWindows:
    """One backend's last counters; `decode` and `prefill` return a closed window's figures."""

    __slots__ = ("_moments", "_prefill", "_own")

    def __init__(self) -> None:
        self._moments: tuple[float, ...] | None = None  # at the open window's start
        self._prefill: tuple[float, float] | None = None  # (busy us, tokens) at its start
        self._own: tuple[float, float, float] | None = None  # the gateway's (tokens, pairs, prompts) then

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

    def prefill(
        self, busy_us: float, tokens: float, own: tuple[float, float, float] | None = None
    ) -> tuple[float, float | None, float | None] | None:
        """(seconds per computed prompt token, and per token of what this gateway had prefilled
        there meanwhile its causal pairs and its prompts, both None when it prefilled nothing or
        `own` is unknown) since the window opened, once it holds MIN_PREFILL_TOKENS tokens; None
        otherwise.

        `own` is the gateway's cumulative (tokens, pairs, prompts) prefilled there at the same
        report, None
        while a prompt of its own was still waiting or part-way (`BackendView.prefilled_at_report`):
        the server counts a long prompt's chunks as it computes them, the gateway counts the whole
        prompt at its first token, so a window aligned on both sides ends at a report between
        prompts. One that opened aligned stays open until such a report, up to
        MAX_PREFILL_TOKENS."""
        if not (math.isfinite(busy_us) and math.isfinite(tokens)):
            return None
        start = self._prefill
        if start is None or tokens < start[1] or busy_us < start[0]:
            self._prefill, self._own = (busy_us, tokens), own
            return None
        n = tokens - start[1]
        if n < MIN_PREFILL_TOKENS:
            return None
        began = self._own
        if own is None and began is not None and n < MAX_PREFILL_TOKENS:
            return None
        self._prefill, self._own = (busy_us, tokens), own
        per_token = (busy_us - start[0]) / n / 1e6
        if per_token <= 0:
            return None
        if own is not None and began is not None and own[0] > began[0] and own[1] >= began[1] and own[2] > began[2]:
            ours = own[0] - began[0]
            return per_token, (own[1] - began[1]) / ours, (own[2] - began[2]) / ours
        return per_token, None, None
