"""The goodput policy: send each request where it will be generated fastest, given the load.

For every healthy candidate it predicts this request's decode tok/s on that backend at the load
it would have after admission (acceptance for the request's domain / step time at that load, see
`policies.estimates`) and picks the best. Acceptance alone would be the wrong signal: it stays
flat while the step time grows with the batch, and speculation stops paying at a load that
depends on the model and the machine (ANCHORS.md research notes).

Objectives:
- `latency`: the fastest backend for this request (highest predicted request tok/s);
- `throughput`: the largest gain in the pool's total tok/s, i.e. the backend whose aggregate
  grows most when it takes one more request (a loaded speculative backend can lose throughput
  by taking another sequence, an AR backend gains ~one sequence's worth).

Three guards keep the learning honest and the traffic stable:
- exploration: an optimism bonus `bonus / sqrt(1 + samples)` that decays as a (backend, domain)
  gets measured, so a backend never measured is tried early while the bonus costs nothing
  later; and with probability `epsilon` (seeded rng) the request goes to the candidate chosen
  least recently, if it was not chosen for `explore_gap` decisions and is predicted within
  `explore_floor` of the best, so an unchosen backend is re-measured and a recovered one is
  noticed, at a bounded cost (a backend predicted 5x slower is not worth a request);
- hysteresis: the backend that won last time for this domain keeps winning unless a challenger
  beats it by more than `hysteresis` (relative), so near-equal candidates do not flap on the
  noise of their estimates; a challenger that is ahead because it holds fewer requests than the
  incumbent needs no margin (that is load balancing: two identical backends share the load);
- random tie-break among exactly equal scores (identical backends must share traffic).
"""

from __future__ import annotations

import math
import random
from typing import Iterable, Sequence

from backends import BackendSpec
from policies.base import BackendView, Decision, NoCandidate, Outcome, RequestFeatures, view_load
from policies.estimates import BackendEstimate, Estimates
from policies.priors import DOMAIN_INDEX, DOMAINS

__all__ = ["OBJECTIVES", "Goodput"]

OBJECTIVES = ("latency", "throughput")
_BONUS_TABLE = 1024  # samples beyond which the optimism bonus is looked up as zero-ish


class Goodput:
    """Predict each candidate's decode tok/s for this request at its load; choose the best."""

    name = "goodput"

    def __init__(self, objective: str = "latency", *, seed: int | None = None,
                 epsilon: float = 0.05, explore_gap: int = 100, explore_floor: float = 0.5,
                 bonus: float = 0.1, hysteresis: float = 0.05,
                 estimates: Estimates | None = None, backends: Iterable[BackendSpec] = (),
                 rng: random.Random | None = None) -> None:
        """`estimates` may be any object with the interface of `Estimates` (the evaluator's
        clairvoyant reference passes one that knows the twin's true parameters)."""
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}, expected one of {list(OBJECTIVES)}")
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"epsilon must be in [0, 1), got {epsilon}")
        if hysteresis < 0 or bonus < 0 or explore_gap < 0 or not 0.0 <= explore_floor <= 1.0:
            raise ValueError("hysteresis, bonus and explore_gap must be >= 0, explore_floor in [0, 1]")
        self.objective = objective
        self.epsilon = epsilon
        self.explore_floor = explore_floor
        self.explore_gap = explore_gap
        self.hysteresis = hysteresis
        self.bonus = bonus
        self.estimates = estimates if estimates is not None else Estimates()
        self.estimates.register_all(backends)
        self._rng = rng or random.Random(seed)
        self._latency = objective == "latency"
        self._bonus = [1.0 + bonus / math.sqrt(1.0 + k) for k in range(_BONUS_TABLE)]
        self._incumbent: list[str | None] = [None] * len(DOMAINS)
        self._tick = 0

    # ---------------------------------------------------------------------- decide

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        d = DOMAIN_INDEX.get(request.domain, 2)
        backends = self.estimates.backends
        latency = self._latency
        bonus_table = self._bonus
        top = _BONUS_TABLE - 1
        incumbent = self._incumbent[d]
        inc_view = inc_est = None
        inc_score = 0.0
        inc_load = 0
        best_view = best_est = None
        best_score = -math.inf
        best_load = 0
        ties = 0
        for v in candidates:
            if not v.healthy:
                continue
            name = v.spec.name
            est = backends.get(name)
            if est is None:
                est = self._register(v)
            load = v.inflight
            rep = v.reported_running
            if rep is not None:  # inlined view_load(v)
                rep += v.reported_waiting or 0
                at = v.reported_inflight
                if at is None:
                    if rep > load:
                        load = rep
                elif rep > at:
                    load += rep - at
            mr = v.max_running
            if mr and mr != est.max_running and mr > 0:
                est.set_max_running(mr)
            if not load:
                est.note_idle()
            acc = v.reported_accept_length
            if acc is not None and acc != est.last_report:
                est.note_report(acc, v.reported_running)
            # an unmeasured AR backend is predicted like its measured AR peers (Estimates.stand_in)
            guess = est if est.observed else self.estimates.stand_in(est)
            if latency:
                score = guess.rate(d, load + 1)
            else:
                score = guess.throughput(d, load + 1) - guess.throughput(d, load)
            k = est.seen[d]
            score += (score if score > 0 else -score) * (bonus_table[k if k < top else top] - 1.0)
            if name == incumbent:
                inc_view, inc_est, inc_score, inc_load = v, est, score, load
            # Scores equal within 1e-9 (relative) are ties: identical backends at equal load.
            tol = 1e-9 * (best_score if best_score > 0 else -best_score) + 1e-12
            if best_view is None or score > best_score + tol:
                best_view, best_est, best_score, best_load, ties = v, est, score, load, 1
            elif score >= best_score - tol:
                ties += 1  # reservoir sampling: every tied candidate equally likely
                if self._rng.random() * ties < 1.0:
                    best_view, best_est, best_score, best_load = v, est, score, load
        if best_view is None:
            raise NoCandidate("no healthy backend")
        self._tick += 1
        reason = "best"
        explore = self._explore(d, candidates, best_score) if (
            self.epsilon and self._rng.random() < self.epsilon) else None
        if explore is not None and explore[0] is not best_view:
            best_view, best_est = explore
            reason = "explore"
        elif inc_view is not None and inc_view is not best_view and inc_load <= best_load:
            # Only a challenger that wins on estimates (not because the incumbent holds more
            # requests) must clear the margin: load balancing is not flapping.
            # An exact tie stays with the random tie-break: identical backends share traffic.
            size = inc_score if inc_score > 0 else -inc_score
            if inc_score + 1e-9 * size + 1e-12 < best_score <= inc_score + self.hysteresis * size:
                best_view, best_est, reason = inc_view, inc_est, "hold"
        assert best_view is not None and best_est is not None
        if reason == "best":
            self._incumbent[d] = best_view.spec.name
        best_est.last_chosen = self._tick
        best_est.note_dispatch(d)
        load = best_load if reason == "best" else view_load(best_view)
        guess = best_est if best_est.observed else self.estimates.stand_in(best_est)
        predicted = guess.rate(d, load + 1)
        return Decision(backend=best_view, score=predicted,
                        reason=f"goodput/{self.objective} {reason}: {predicted:.1f} tok/s at load {load + 1}")

    def _explore(self, d: int, candidates: Sequence[BackendView], best_score: float
                 ) -> tuple[BackendView, BackendEstimate] | None:
        """The candidate chosen least recently among those not chosen for `explore_gap`
        decisions and predicted within `explore_floor` of the best: exploring a backend
        predicted 5x slower would cost a whole request for almost no chance of learning that
        it is the best one, and re-measuring one just measured teaches nothing."""
        floor = best_score - (1.0 - self.explore_floor) * abs(best_score)
        stale = self._tick - self.explore_gap
        pick: tuple[BackendView, BackendEstimate] | None = None
        for v in candidates:
            if not v.healthy:
                continue
            est = self.estimates.backends[v.spec.name]
            if est.last_chosen > stale or self._score(est, d, view_load(v)) < floor:
                continue
            if pick is None or est.last_chosen < pick[1].last_chosen:
                pick = (v, est)
        return pick

    def _score(self, est: BackendEstimate, d: int, load: int) -> float:
        """The objective's score before the exploration bonus (the hot loop inlines this)."""
        if not est.observed:
            est = self.estimates.stand_in(est)
        if self._latency:
            return est.rate(d, load + 1)
        return est.throughput(d, load + 1) - est.throughput(d, load)

    def observe(self, outcome: Outcome) -> None:
        self.estimates.observe(outcome)

    # ------------------------------------------------------------------- introspect

    def describe(self, candidates: Sequence[BackendView] | None = None) -> dict[str, dict]:
        """Per backend: acceptance per domain, step time and request tok/s per load bucket, and
        (given the current views) the predicted tok/s of a new request per domain right now.
        Plain dicts, for `/admin/backends`."""
        out = self.estimates.describe()
        for v in candidates or ():
            est = self.estimates.backends.get(v.spec.name) or self._register(v)
            load = view_load(v)
            entry = out.setdefault(v.spec.name, est.describe())
            entry["load"] = load
            entry["predicted_tok_s"] = {dom.value: round(est.rate(i, load + 1), 1)
                                        for i, dom in enumerate(DOMAINS)}
        out_meta = {"objective": self.objective, "decisions": self._tick,
                    "telemetry_used": self.estimates.used,
                    "telemetry_skipped": dict(self.estimates.skipped)}
        return {"policy": out_meta, "backends": out}  # type: ignore[dict-item]

    def _register(self, v: BackendView) -> BackendEstimate:
        return self.estimates.register(v.spec.name, v.spec.strategy, v.max_running)
