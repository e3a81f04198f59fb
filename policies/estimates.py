"""Live estimates of how fast each backend decodes: acceptance per domain, step time per load.

Decode speed of one request on a backend is (tokens per verify pass) / (seconds per pass). The
two factors move for different reasons, so they are learned separately:

- acceptance depends on the prompt's domain (math and code draft better than chat) and on the
  drafter; it is flat in load (the vLLM measurement of STUDIES.md): one EWMA per (backend, domain);
- step time depends on the batch, i.e. on how many requests the backend holds; it is learned as
  a multiplicative correction of the strategy's prior curve per load bucket (in flight 1, 2, 4,
  ..., 128+), linearly interpolated in between. A bucket never observed borrows the correction of
  the nearest observed one, so one measurement at low load already rescales the whole curve.

Everything is O(1) per update and per lookup with a fixed amount of memory per backend. Garbage
telemetry (errors, missing or non-finite fields) is skipped and counted, never raised: a broken
upstream must not break routing.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from backends import BackendSpec, Strategy
from policies.base import Domain, Outcome
from policies.priors import DEFAULT_PRIORS, DOMAIN_INDEX, DOMAINS, StrategyPrior, prior_for

__all__ = ["BUCKETS", "BackendEstimate", "Estimates"]

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
_TOP = len(BUCKETS) - 1
_MAX_ACCEPT = 64.0  # no drafter verifies more tokens per pass
_MIN_STEP_S, _MAX_STEP_S = 1e-5, 60.0
# Reported/expected acceptance within +-20% is noise: the report is a window of ~40 steps, a
# few requests at low load, whose acceptance varies per prompt and per step.
_DRIFT_BAND = 0.2


def _position(load: float) -> tuple[int, float]:
    """Bucket index and fraction towards the next bucket of a load (linear within an octave)."""
    if load <= 1.0:
        return 0, 0.0
    if load >= BUCKETS[_TOP]:
        return _TOP, 0.0
    i = int(math.log2(load))
    return i, load / (1 << i) - 1.0


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class BackendEstimate:
    """What is known about one backend. Lookups are plain arithmetic: they run per request."""

    __slots__ = (
        "name", "strategy", "speculative", "prior", "max_running", "accept", "accept_n", "seen",
        "last_chosen", "factor", "factor_n", "_acc", "_base", "mix", "_last_mix", "drift", "last_report", "ratio", "ratio_n", "_eff", "observed", "last_step_s", "last_tok_s", "_alpha",
        "_step_alpha", "_prior_weight",
    )

    def __init__(self, name: str, strategy: Strategy, prior: StrategyPrior, *,
                 max_running: int | None = None, alpha: float = 0.2, step_alpha: float = 0.2,
                 prior_weight: float = 1.0) -> None:
        self.name = name
        self.strategy = strategy
        self.speculative = strategy.speculative
        self.prior = prior
        self.max_running = max_running or prior.max_running
        self.accept = list(prior.accept)  # EWMA of observed acceptance per domain
        self.accept_n = [0.0] * len(DOMAINS)  # acceptance samples (speculative only)
        self.factor = 1.0  # observed / prior acceptance over all domains: the drafter's quality
        self.factor_n = 0
        self._base = list(prior.accept)  # samples blended with prior x factor
        self._acc = list(prior.accept)  # what lookups use: _base x drift
        self.mix = [0.0] * len(DOMAINS)  # requests in flight here per domain (as dispatched)
        self._last_mix = [1.0] * len(DOMAINS)  # the last non-empty mix: an idle report shows it
        self.drift = 1.0  # backend-reported / expected acceptance, outside a dead band
        self.last_report: float | None = None
        self.seen = [0] * len(DOMAINS)  # usable outcomes per domain (drives the exploration bonus)
        self.last_chosen = 0  # decision tick of the last time a policy sent a request here
        self.ratio = [1.0] * len(BUCKETS)  # observed / prior step time, per bucket
        self.ratio_n = [0.0] * len(BUCKETS)
        self._eff = [1.0] * (len(BUCKETS) + 1)  # with borrowing; one spare slot for i+1 at the top
        self.observed = 0
        self.last_step_s: float | None = None
        self.last_tok_s: float | None = None
        self._alpha = alpha
        self._step_alpha = step_alpha
        self._prior_weight = prior_weight

    # ---------------------------------------------------------------- lookups (hot path)

    def step_s(self, load: int) -> float:
        """Predicted seconds per decode/verify pass with `load` requests in flight."""
        cap = self.max_running
        p = self.prior.step
        b = load if load < cap else cap
        if b < 1:
            b = 1
        base = p.t0_s + p.k_s * (b * p.width - 1) + p.draft0_s + p.draft1_s * (b - 1)
        if load <= 1:
            return base * self._eff[0]
        if load >= 128:
            return base * self._eff[_TOP]
        i = load.bit_length() - 1
        f = load / (1 << i) - 1.0
        e = self._eff
        return base * (e[i] + (e[i + 1] - e[i]) * f)

    def accept_length(self, d: int) -> float:
        """Predicted tokens per verify pass for domain index `d` (1.0 for AR)."""
        return self._acc[d]

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

    # ------------------------------------------------------------------------ updates

    def observe(self, outcome: Outcome) -> str | None:
        """Learn from one finished request; returns why it was skipped, or None if used."""
        d = DOMAIN_INDEX.get(outcome.domain)
        if d is None:
            try:
                d = DOMAIN_INDEX[Domain(outcome.domain)]
            except ValueError:
                return "bad_domain"
        self._note_done(d)  # finished, failed or garbled: it is no longer in flight
        if outcome.error:
            return "error"
        n = outcome.completion_tokens
        if not isinstance(n, int) or n < 2:
            return "too_few_tokens"
        decode_s = outcome.decode_s
        if not _finite(decode_s) or decode_s <= 0:
            return "bad_decode_s"
        load: object = outcome.mean_inflight
        if not _finite(load) or load < 1:  # type: ignore[operator]
            load = outcome.inflight_at_dispatch
        if not _finite(load) or load < 1:  # type: ignore[operator]
            return "bad_load"
        if self.speculative:
            verify_ct = outcome.verify_ct
            accept = outcome.accept_length
            if isinstance(verify_ct, int) and not isinstance(verify_ct, bool) and verify_ct > 0:
                accept = n / verify_ct
            elif _finite(accept) and accept >= 1.0:  # type: ignore[operator]
                verify_ct = max(1, round(n / accept))  # type: ignore[operator]
            else:
                return "no_spec_details"
            if not 1.0 <= accept <= _MAX_ACCEPT:  # type: ignore[operator]
                return "bad_accept"
            step = decode_s / verify_ct
        else:
            accept = None
            step = decode_s / (n - 1)
        if not _MIN_STEP_S <= step <= _MAX_STEP_S:
            return "bad_step"
        if accept is not None:
            self._update_accept(d, float(accept))  # type: ignore[arg-type]
        self._update_step(float(load), step)  # type: ignore[arg-type]
        self.seen[d] += 1
        self.observed += 1
        self.last_step_s = step
        self.last_tok_s = (n - 1) / decode_s
        return None

    def _update_accept(self, d: int, x: float) -> None:
        """EWMA per domain (the first samples average, then weight `alpha`); a domain with few
        samples leans on its prior scaled by what the other domains showed of this drafter."""
        self.accept_n[d] += 1.0
        self.accept[d] += max(self._alpha, 1.0 / self.accept_n[d]) * (x - self.accept[d])
        self.factor_n += 1
        self.factor += max(self._alpha, 1.0 / self.factor_n) * (x / self.prior.accept[d] - self.factor)
        k = self._prior_weight
        for j in range(len(DOMAINS)):
            n = self.accept_n[j]
            guess = max(1.0, self.prior.accept[j] * self.factor)
            self._base[j] = (n * self.accept[j] + k * guess) / (n + k)
        self._refresh_drift()

    def note_dispatch(self, d: int) -> None:
        """A request of domain `d` was sent here: the backend's windowed report reflects the
        domains in flight, so the drift check must compare against that mix."""
        self.mix[d] += 1.0

    def note_idle(self) -> None:
        """The caller saw no request of ours in flight here: forget counts of lost outcomes."""
        if any(self.mix):
            self._last_mix = list(self.mix)
            self.mix = [0.0] * len(DOMAINS)

    def _note_done(self, d: int) -> None:
        if self.mix[d] >= 1.0:
            total = sum(self.mix)
            if total <= 1.0:
                self._last_mix = list(self.mix)
            self.mix[d] -= 1.0

    def note_report(self, reported_accept: float) -> None:
        """The backend's own windowed accept length (polled): the fastest signal that a drafter
        changed, seconds before finished requests say so. Its ratio to what the estimates
        expect for the recent domain mix scales every domain, outside a noise dead band; as the
        per-domain estimates catch up from outcomes the ratio returns to 1."""
        self.last_report = reported_accept
        if not self.speculative:
            return
        if not _finite(reported_accept) or not 1.0 <= reported_accept <= _MAX_ACCEPT:
            self.drift = 1.0
        else:
            mix = self.mix if any(self.mix) else self._last_mix
            expected = sum(m * a for m, a in zip(mix, self._base)) / sum(mix)
            ratio = reported_accept / expected if expected > 0 else 1.0
            self.drift = ratio if abs(ratio - 1.0) > _DRIFT_BAND else 1.0
        self._refresh_drift()

    def _refresh_drift(self) -> None:
        drift = self.drift
        for j in range(len(DOMAINS)):
            self._acc[j] = max(1.0, self._base[j] * drift)

    def _update_step(self, load: float, step: float) -> None:
        ld = int(round(load))
        cap = self.max_running
        b = min(max(ld, 1), cap)
        x = step / self.prior.step.step_s(b)
        i, f = _position(load)
        for j, w in ((i, 1.0 - f), (i + 1, f)):
            if w <= 0.0 or j > _TOP:
                continue
            base = self.ratio[j] if self.ratio_n[j] > 0 else self._eff[j]
            self.ratio_n[j] += w
            a = w * max(self._step_alpha, 1.0 / (self.ratio_n[j] + self._prior_weight))
            self.ratio[j] = base + a * (x - base)
        self._refresh()

    def _refresh(self) -> None:
        """Effective correction per bucket: its own, or borrowed from the nearest observed one."""
        n, r, eff = self.ratio_n, self.ratio, self._eff
        last = None
        left: list[float | None] = [None] * len(BUCKETS)
        left_d = [0] * len(BUCKETS)
        for j in range(len(BUCKETS)):
            if n[j] > 0:
                last = j
            left[j] = r[last] if last is not None else None
            left_d[j] = j - last if last is not None else 99
        last = None
        for j in range(_TOP, -1, -1):
            if n[j] > 0:
                last = j
            right = r[last] if last is not None else None
            right_d = last - j if last is not None else 99
            lv = left[j]
            if lv is None and right is None:
                eff[j] = 1.0
            elif right is None or (lv is not None and left_d[j] < right_d):
                eff[j] = lv  # type: ignore[assignment]
            elif lv is None or right_d < left_d[j]:
                eff[j] = right
            else:
                eff[j] = 0.5 * (lv + right)
        eff[_TOP + 1] = eff[_TOP]

    # --------------------------------------------------------------------- reporting

    def describe(self) -> dict:
        """Plain-dict snapshot for `/admin/backends` and eval reports."""
        return {
            "strategy": self.strategy.value,
            "max_running": self.max_running,
            "observed": self.observed,
            "accept_length": {dom.value: round(self._acc[i], 3) for i, dom in enumerate(DOMAINS)},
            "accept_drift": round(self.drift, 3),
            "accept_samples": {dom.value: int(self.accept_n[i]) for i, dom in enumerate(DOMAINS)},
            "step_ms": {str(b): round(self.step_s(b) * 1000, 2) for b in BUCKETS},
            "step_samples": {str(b): round(self.ratio_n[k], 1) for k, b in enumerate(BUCKETS)},
            "request_tok_s": {str(b): round(self.rate(DOMAIN_INDEX[Domain.CHAT], b), 1)
                              for b in BUCKETS},
        }


class Estimates:
    """Estimates of every backend a policy has seen, keyed by backend name."""

    def __init__(self, priors: Mapping[Strategy, StrategyPrior] = DEFAULT_PRIORS, *,
                 alpha: float = 0.2, step_alpha: float = 0.2) -> None:
        self.priors = priors
        self.alpha = alpha
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
                                  max_running=max_running, alpha=self.alpha,
                                  step_alpha=self.step_alpha)
            self.backends[name] = est
        elif max_running and max_running > 0:
            est.max_running = max_running
        return est

    def register_all(self, specs: Iterable[BackendSpec]) -> None:
        for spec in specs:
            self.register(spec.name, spec.strategy)

    def get(self, name: str) -> BackendEstimate | None:
        return self.backends.get(name)

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
