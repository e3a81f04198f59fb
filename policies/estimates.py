"""Live estimates of how fast each backend decodes, learned from finished requests.

Decode speed of one request is (tokens per verify pass) / (seconds per pass). The two factors
move for different reasons, so they are learned separately: acceptance per prompt domain
(`policies.acceptance`: flat in load, the vLLM measurement of STUDIES.md) and step time per
load (`policies.steptime`: grows with the batch). Their quotient, at the load a request would
find, is what the goodput policy ranks backends by.

Everything is O(1) per update and per lookup with a fixed amount of memory per backend. Garbage
telemetry (errors, missing or non-finite fields) is skipped and counted, never raised: a broken
upstream must not break routing.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from backends import BackendSpec, Strategy
from policies.acceptance import Acceptance
from policies.base import Domain, Outcome
from policies.priors import DEFAULT_PRIORS, DOMAIN_INDEX, DOMAINS, StrategyPrior, prior_for
from policies.steptime import BUCKETS, StepCurve

__all__ = ["BUCKETS", "BackendEstimate", "Estimates"]

_MAX_ACCEPT = 64.0  # no drafter verifies more tokens per pass
_MIN_STEP_S, _MAX_STEP_S = 1e-5, 60.0


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class RateModel:
    """Decode speed from acceptance per domain (`_acc`), step time per load (`step_s`) and the
    cap (`max_running`): the live estimate and the evaluator's oracle predict alike."""

    __slots__ = ()
    _acc: list[float]
    max_running: int

    def step_s(self, load: int) -> float:  # provided by the subclass (an attribute or a method)
        raise NotImplementedError

    def rate(self, d: int, load: int) -> float:
        """Predicted decode tok/s of one request of domain index `d` with `load` in flight
        (this request included). Beyond `max_running` the request first queues: its share of
        the backend's throughput shrinks by max_running/load."""
        r = self._acc[d] / self.step_s(load)
        cap = self.max_running
        return r * cap / load if load > cap else r

    def throughput(self, d: int, load: int) -> float:
        """Predicted aggregate tok/s of the backend holding `load` requests of domain `d`."""
        if load <= 0:
            return 0.0
        cap = self.max_running
        return self._acc[d] * (load if load < cap else cap) / self.step_s(load)


class BackendEstimate(RateModel):
    """What is known about one backend. Lookups are plain arithmetic: they run per request."""

    __slots__ = ("name", "strategy", "speculative", "prior", "max_running", "acceptance", "curve",
                 "step_s", "_acc", "seen", "last_chosen", "last_report", "observed",
                 "last_step_s", "last_tok_s")

    def __init__(self, name: str, strategy: Strategy, prior: StrategyPrior, *,
                 max_running: int | None = None, step_alpha: float = 0.2) -> None:
        self.name = name
        self.strategy = strategy
        self.speculative = strategy.speculative
        self.prior = prior
        self.max_running = max_running or prior.max_running
        self.acceptance = Acceptance(prior.accept)
        self.curve = StepCurve(prior.step, self.max_running, step_alpha)
        self.step_s = self.curve.step_s  # seconds per pass at a load (bound method, hot path)
        self._acc = self.acceptance.values  # same list, updated in place
        self.seen = [0] * len(DOMAINS)  # usable outcomes per domain (drives the exploration bonus)
        self.last_chosen = 0  # decision tick of the last time a policy sent a request here
        self.last_report: float | None = None
        self.observed = 0
        self.last_step_s: float | None = None
        self.last_tok_s: float | None = None

    # ---------------------------------------------------------------- lookups (hot path)

    def accept_length(self, d: int) -> float:
        """Predicted tokens per verify pass for domain index `d` (1.0 for AR)."""
        return self._acc[d]

    # ------------------------------------------------------------------------ updates

    def set_max_running(self, max_running: int) -> None:
        """The backend's `max_running_requests` as it reports it (`/server_info`)."""
        self.max_running = max_running
        self.curve.max_running = max_running

    def note_dispatch(self, d: int) -> None:
        self.acceptance.note_dispatch(d)

    def note_idle(self) -> None:
        self.acceptance.note_idle()

    def note_report(self, reported_accept: float, running: int | None) -> None:
        self.last_report = reported_accept
        if self.speculative:
            self.acceptance.note_report(reported_accept, running)

    def observe(self, outcome: Outcome) -> str | None:
        """Learn from one finished request; returns why it was skipped, or None if used."""
        d = DOMAIN_INDEX.get(outcome.domain)
        if d is None:
            try:
                d = DOMAIN_INDEX[Domain(outcome.domain)]
            except ValueError:
                return "bad_domain"
        self.acceptance.note_done(d)  # finished, failed or garbled: no longer in flight
        if outcome.error:
            return "error"
        n = outcome.completion_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            return "too_few_tokens"
        decode_s = outcome.decode_s
        if not _finite(decode_s) or decode_s <= 0:  # type: ignore[operator]
            return "bad_decode_s"
        load: object = outcome.mean_inflight
        if not _finite(load) or load < 1:  # type: ignore[operator]
            load = outcome.inflight_at_dispatch
        if not _finite(load) or load < 1:  # type: ignore[operator]
            return "bad_load"
        accept: float | None = None
        if self.speculative:
            verify_ct = outcome.verify_ct
            if isinstance(verify_ct, int) and not isinstance(verify_ct, bool) and verify_ct > 0:
                accept = n / verify_ct
            elif _finite(outcome.accept_length) and outcome.accept_length >= 1.0:  # type: ignore[operator]
                accept = float(outcome.accept_length)  # type: ignore[arg-type]
                verify_ct = max(1, round(n / accept))
            else:
                return "no_spec_details"
            if not 1.0 <= accept <= _MAX_ACCEPT:
                return "bad_accept"
            step = decode_s / verify_ct  # type: ignore[operator]
        else:
            step = decode_s / (n - 1)  # type: ignore[operator]
        if not _MIN_STEP_S <= step <= _MAX_STEP_S:
            return "bad_step"
        if accept is not None:
            self.acceptance.observe(d, accept)
        self.curve.observe(float(load), step)  # type: ignore[arg-type]
        self.seen[d] += 1
        self.observed += 1
        self.last_step_s = step
        self.last_tok_s = (n - 1) / decode_s  # type: ignore[operator]
        return None

    # --------------------------------------------------------------------- reporting

    def describe(self) -> dict:
        """Plain-dict snapshot for `/admin/backends` and eval reports."""
        out: dict = {"strategy": self.strategy.value, "max_running": self.max_running,
                     "observed": self.observed}
        out.update(self.acceptance.describe() if self.speculative else
                   {"accept_length": {dom.value: 1.0 for dom in DOMAINS}})
        out.update(self.curve.describe())
        out["request_tok_s"] = {dom.value: {str(b): round(self.rate(i, b), 1) for b in BUCKETS}
                                for i, dom in enumerate(DOMAINS)}
        return out


class Estimates:
    """Estimates of every backend a policy has seen, keyed by backend name."""

    def __init__(self, priors: Mapping[Strategy, StrategyPrior] = DEFAULT_PRIORS, *,
                 step_alpha: float = 0.2) -> None:
        self.priors = priors
        self.step_alpha = step_alpha
        self.backends: dict[str, BackendEstimate] = {}
        self.used = 0
        self.skipped: dict[str, int] = {}

    def register(self, name: str, strategy: Strategy | str, max_running: int | None = None
                 ) -> BackendEstimate:
        """The estimate of `name`, created from its strategy's prior on first sight."""
        est = self.backends.get(name)
        if est is None:
            try:
                strat = Strategy(strategy)
            except ValueError:
                strat = Strategy.AR
            est = BackendEstimate(name, strat, prior_for(strat, self.priors),
                                  max_running=max_running, step_alpha=self.step_alpha)
            self.backends[name] = est
        elif max_running and max_running > 0:
            est.set_max_running(max_running)
        return est

    def register_all(self, specs: Iterable[BackendSpec]) -> None:
        for spec in specs:
            self.register(spec.name, spec.strategy)

    def get(self, name: str) -> BackendEstimate | None:
        return self.backends.get(name)

    def stand_in(self, est: BackendEstimate) -> BackendEstimate:
        """What to predict an unmeasured backend with: for an autoregressive backend, the most
        measured AR backend of this pool, else its own prior.

        A prior can be off by far more than any exploration bonus covers (a faster GPU, a
        time-scaled twin), and a backend that looks far slower than its measured peers is never
        tried, so never measured. Two AR servers of one model differ only by their hardware, so a
        measured one is the better guess. Speculative backends of one strategy do not stand in
        for each other: their speed hangs on drafter settings the gateway does not see (DDTree
        budget 15 vs 64 on Qwen3.6 is 2.6x apart)."""
        if est.speculative:
            return est
        best = est
        for other in self.backends.values():
            if not other.speculative and other.observed > best.observed:
                best = other
        return best

    def observe(self, outcome: Outcome) -> bool:
        """Feed one telemetry record; False (and a counted reason) when it was unusable."""
        try:
            est = self.backends.get(outcome.backend)
            reason = "unknown_backend" if est is None else est.observe(outcome)
        except Exception:  # telemetry must never break routing
            reason = "malformed"
        if reason is None:
            self.used += 1
            return True
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        return False

    def describe(self) -> dict[str, dict]:
        return {name: est.describe() for name, est in self.backends.items()}
