"""The goodput policy: send each request where it costs the pool the least time, given the load,
the speculation each backend does and the conversation prefix each backend holds.

For every healthy candidate it predicts (`policies.cost`) what this request would cost there:

- its own time: TTFT (waiting for a slot when the backend is full, plus prefill of the part of the
  prompt the backend's radix cache does not hold, `policies.prefix_cache`) plus the decode time of
  the expected output (`policies.lengths`) at the acceptance of the request's cell (domain,
  temperature band, context band) over the step time at the load it would find;
- under the default `latency` objective, also the time it adds to the requests already running
  there: each of their remaining passes gets longer by the step-time increase one more sequence
  causes, and its prefill rides in their passes. Ranking by own time alone is the selfish rule: in
  a closed loop it sends every request to the fastest backend until that one is barely better than
  the next idle one (the herding `specroute demo` showed: 61 of 64 requests on DFlash, two idle
  backends and an aggregate below DFlash alone); charging each request for the slowdown it imposes
  makes the per-request choices add up to the least total time.

Objectives:
- `latency` (default): least predicted time, own plus imposed (`externality` weight, 1.0; 0.0 is
  the selfish rule; `ttft_weight` counts a second of TTFT as that many seconds, 1.0; each predicted
  second of TTFT past `ttft_slo_s`, 5 s, costs `slo_weight` more, 1.0, and so does each second
  a decode slower than `tpot_slo_s`, 0.06 s a token, adds over one at that pace);
- `throughput`: the largest gain in the pool's total tok/s (a loaded speculative backend can lose
  throughput by taking another sequence, an AR backend gains ~one sequence's worth), less the
  tokens the others lose while its prefill holds them up.

Guards keep the learning honest and the traffic stable:
- exploration: an optimism bonus `bonus / sqrt(1 + samples)` that decays as a (backend, domain)
  gets measured, so a backend never measured is tried early while the bonus costs nothing
  later; and with probability `epsilon` (seeded rng) the request goes to the candidate chosen
  least recently, if it was not chosen for `explore_gap` decisions and both its cost and this
  request's own predicted e2e there are within 1/`explore_floor` of the best's (a backend
  predicted 5x slower is not worth a request; 0: any). The e2e check matters at load: there the
  best's cost is mostly what it imposes on the requests running beside it, and an idle backend
  that would take 3x longer for this request can be within 2x on cost;
- hysteresis: the backend that won last time for this domain keeps winning unless a challenger
  is cheaper by more than `hysteresis` (relative), so near-equal candidates do not flap on the
  noise of their estimates; a challenger that is ahead because it holds fewer requests than the
  incumbent needs no margin (that is load balancing: two identical backends share the load);
- random tie-break among exactly equal costs (identical backends must share traffic).

Copy-heavy turns (`RequestFeatures.copy_of`, `policies.copy`): the policy remembers which backend
answered each history (from the outcomes, a pinned request's too; bounded, oldest out), so for a
turn that asks an earlier answer back it knows the backend that generated that answer. Only there
is the request in its copy cell (`policies.priors.cell_of`): an NGRAM server drafts the copy from
its own trie, learned apart from its prose; anywhere else the turn is ordinary text of its domain.
That backend also holds the conversation's prefix, so prefix affinity and the copy cell agree.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec

from backends import BackendSpec
from backends.measure import Measurement
from policies.base import BackendView, Decision, NoCandidate, Outcome, RequestFeatures, view_load
from policies.cost import kv_bound, own_and_imposed_s, throughput_gain
from policies.estimates import BackendEstimate, Estimates
from policies.lengths import OutputLengths
from policies.prefill import causal_pairs
from policies.prefix_cache import TRACKED_TOKENS, PrefixCache, tracked
from policies.priors import DOMAIN_INDEX, DOMAINS, cell_of

__all__ = ["OBJECTIVES", "Goodput"]

OBJECTIVES = ("latency", "throughput")
_BONUS_TABLE = 1024  # samples beyond which the optimism bonus is looked up as zero-ish
_TYPICAL_ALPHA = 0.02  # EWMA weight of one request in the typical request's KV tokens (~50 requests)
# Histories whose backend is remembered for a later copy-heavy turn (one entry a request, an int
# and a shared name: ~6 MB at most); a conversation idle past that many requests is not traced.
_ANSWERED = 65536


class _Cells(NamedTuple):
    """A request's acceptance cells: `plain` everywhere, `copy` on `source`, the backend that
    generated the answer a copy-heavy turn asks back (None: not such a turn, or not known)."""

    plain: int
    copy: int
    source: str | None

    def on(self, backend: str) -> int:
        return self.copy if backend == self.source else self.plain


class _Scored(msgspec.Struct, gc=False):
    """One candidate as the scorer left it: its cost for this request and what that cost assumed."""

    view: BackendView
    est: BackendEstimate
    cost: float
    load: int
    uncached: int  # prompt tokens its cache does not hold
    held: int  # tracked prefix blocks it holds
    cell: int  # the request's acceptance cell there (its copy cell on the backend that wrote the source)


class Goodput:
    """Predict each candidate's cost for this request at its load and prefix; choose the least."""

    name = "goodput"

    def __init__(
        self,
        objective: str = "latency",
        *,
        seed: int | None = None,
        epsilon: float = 0.05,
        explore_gap: int = 100,
        explore_floor: float = 0.5,
        bonus: float = 0.1,
        hysteresis: float = 0.05,
        externality: float = 1.0,
        ttft_weight: float = 1.0,
        ttft_slo_s: float | None = 5.0,
        tpot_slo_s: float | None = 0.06,
        slo_weight: float = 1.0,
        prefix_tracking: bool = True,
        estimates: Estimates | None = None,
        backends: Iterable[BackendSpec] = (),
        rng: random.Random | None = None,
    ) -> None:
        """`estimates` may be any object with the interface of `Estimates` (the evaluator's
        clairvoyant reference passes one that knows the twin's true parameters)."""
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}, expected one of {list(OBJECTIVES)}")
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"epsilon must be in [0, 1), got {epsilon}")
        if hysteresis < 0 or bonus < 0 or explore_gap < 0 or not 0.0 <= explore_floor <= 1.0:
            raise ValueError("hysteresis, bonus and explore_gap must be >= 0, explore_floor in [0, 1]")
        if not 0.0 <= externality <= 10.0:
            raise ValueError(f"externality must be in [0, 10], got {externality}")
        if not 0.0 < ttft_weight <= 10.0:
            raise ValueError(f"ttft_weight must be in (0, 10], got {ttft_weight}")
        if ttft_slo_s is not None and not 0.0 < ttft_slo_s <= 3600.0:
            raise ValueError(f"ttft_slo_s must be in (0, 3600] seconds or None, got {ttft_slo_s}")
        if tpot_slo_s is not None and not 0.0 < tpot_slo_s <= 60.0:
            raise ValueError(f"tpot_slo_s must be in (0, 60] seconds or None, got {tpot_slo_s}")
        if not 0.0 <= slo_weight <= 100.0:
            raise ValueError(f"slo_weight must be in [0, 100], got {slo_weight}")
        self.ttft_weight = ttft_weight
        self.ttft_slo_s = math.inf if ttft_slo_s is None else ttft_slo_s
        self.tpot_slo_s = math.inf if tpot_slo_s is None else tpot_slo_s
        self.slo_weight = slo_weight
        self.objective = objective
        self.epsilon = epsilon
        self.explore_floor = explore_floor
        self.explore_gap = explore_gap
        self.hysteresis = hysteresis
        self.bonus = bonus
        self.externality = externality
        self.estimates = estimates if estimates is not None else Estimates()
        self.estimates.register_all(backends)
        self.lengths = OutputLengths()
        self.prefixes: PrefixCache | None = PrefixCache() if prefix_tracking else None
        self._rng = rng or random.Random(seed)
        self._latency = objective == "latency"
        self._bonus = [bonus / math.sqrt(1.0 + k) for k in range(_BONUS_TABLE)]
        self._incumbent: list[str | None] = [None] * len(DOMAINS)
        self._tick = 0
        # KV tokens (prompt + expected output) of a typical request, an EWMA over the decisions:
        # what the requests a backend runs hold besides this one (`policies.cost.kv_bound`)
        self._typical_tokens = 0.0
        # a history's answer key -> the backend that answered it: who generated the text after it
        self._answered: dict[int, str] = {}
        # expected output tokens of a typical request, the same EWMA: how long the requests a full
        # backend runs take to free their slots (`policies.cost`)
        self._typical_out = 0.0
        # per backend: seconds a request holds its slot there (decode, first to last token), an EWMA
        # over its finished requests: a full backend frees its `cap` slots once per that time
        self._slot_s: dict[str, float] = {}

    # ---------------------------------------------------------------------- decide

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        """Score every healthy candidate (`_score`), then pick among them (`_pick`): llm-d's
        scheduler shape, filter, scorer, picker."""
        d = DOMAIN_INDEX.get(request.domain, 2)
        cell = cell_of(d, request.temperature, request.prompt_tokens)
        source = self.source_of(request)
        cells = _Cells(cell, cell_of(d, request.temperature, request.prompt_tokens, True) if source else cell, source)
        out = self.lengths.expected(request)
        prefixes = self.prefixes
        chain = tracked(request.prefix) if prefixes is not None else ()
        depths = prefixes.depths(chain) if prefixes is not None and chain else None
        scored = self._score(request, candidates, d, cells, out, depths)
        if not scored:
            raise NoCandidate("no healthy backend")
        self._tick += 1
        best, reason = self._pick(request, candidates, scored, d, cells, out)
        best.est.last_chosen = self._tick
        best.est.note_dispatch(best.cell)
        name = best.view.spec.name
        if prefixes is not None and chain:
            prefixes.of(name, best.view.kv_tokens).record(chain, best.held)
        guess = best.est if best.est.observed else self.estimates.stand_in(best.est)
        after = best.load + request.sequences
        predicted = guess.accept_at(best.cell) / guess.step_s(after)
        cap = guess.max_running
        if after > cap:
            predicted *= cap / after
        prompt = request.prompt_tokens
        cached = f", {prompt - best.uncached} cached" if best.uncached < prompt else ""
        copy = ", copy" if best.cell != cell else ""
        return Decision(
            backend=best.view,
            score=predicted,
            prefill_tokens=best.uncached,
            expected_tokens=out,
            reason=f"goodput/{self.objective} {reason}: {predicted:.1f} tok/s at load {after}{cached}{copy}",
        )

    def _remember_answer(self, key: int, backend: str) -> None:
        """`backend` answered the history `key`. Each turn's history has a key of its own, written
        once: the oldest entries go first."""
        answered = self._answered
        answered[key] = backend
        if len(answered) > _ANSWERED:
            del answered[next(iter(answered))]

    def source_of(self, request: RequestFeatures) -> str | None:
        """The backend that generated the answer a copy-heavy turn asks back, when known."""
        return self._answered.get(request.copy_of) if request.copy_of else None

    def _score(
        self,
        request: RequestFeatures,
        candidates: Sequence[BackendView],
        d: int,
        cells: _Cells,
        out: float,
        depths: dict[str, int] | None,
    ) -> list[_Scored]:
        """Every healthy candidate with this request's cost there (`_cost`'s: the cost model of
        `policies.cost`, with what is the same for every candidate taken out of the loop), less the
        exploration bonus of its domain's measurements, in the candidates' order. Each candidate's
        estimate first takes in what its view reports (cap, idleness, windowed acceptance, counters)."""
        prompt = request.prompt_tokens
        whole = causal_pairs(prompt, prompt)  # the pairs of a prompt no backend holds any of
        k = request.sequences
        size = (prompt + out) * k
        typical = self._typical_tokens
        self._typical_tokens = size if not typical else typical + _TYPICAL_ALPHA * (size - typical)
        drain_out = self._typical_out
        self._typical_out = out if not drain_out else drain_out + _TYPICAL_ALPHA * (out - drain_out)
        bonus_table = self._bonus
        top = _BONUS_TABLE - 1
        estimates = self.estimates
        if self._latency:
            weight, wt, slo, over = self.externality, self.ttft_weight, self.ttft_slo_s, self.slo_weight
            tpot_slo = self.tpot_slo_s
        scored: list[_Scored] = []
        backends = estimates.backends
        slot_s = self._slot_s
        plain, copy_cell, source = cells
        for v in candidates:
            if not v.healthy:
                continue
            load = view_load(v)
            # the candidate's estimate, told what its view reports since the last decision
            est = backends.get(v.spec.name)
            if est is None:
                est = self._register(v)
            mr = v.max_running
            if mr and mr != est.max_running and mr > 0:
                est.set_max_running(mr)
            if not load:
                est.note_idle()
            acc = v.reported_accept_length
            if acc is not None and acc != est.last_report:
                est.note_report(acc, v.reported_running)
            if v.decode_moments is not est.last_moments or v.prefill_counters is not est.last_prefill_counters:
                est.note_counters(v.decode_moments, v.prefill_counters, v.prefilled_at_report)
            cell = copy_cell if v.spec.name == source else plain  # cells.on, inlined in the hot loop
            held = depths.get(v.spec.name, 0) if depths else 0
            uncached = prompt
            if held:
                uncached -= held * TRACKED_TOKENS
                if uncached < 0:
                    uncached = 0
            pairs = whole if uncached == prompt else causal_pairs(prompt, uncached)
            # an unmeasured AR backend is predicted like its measured AR peers (Estimates.stand_in)
            guess = est if est.observed or est.speculative else estimates.stand_in(est)
            if self._latency:
                pending, pending_pairs = v.pending_prefill, v.pending_pairs
                cost = own_and_imposed_s(
                    guess,
                    cell,
                    load,
                    uncached,
                    out,
                    weight,
                    wt,
                    pending,
                    slo,
                    over,
                    k,
                    pairs,
                    pending_pairs,
                    tpot_slo,
                    kv_bound(v.kv_tokens, size, typical),
                    drain_out,
                    slot_s.get(v.spec.name, 0.0),
                    v.residents,
                )
            else:
                cost = -throughput_gain(
                    guess,
                    cell,
                    load,
                    uncached,
                    out,
                    sequences=k,
                    pairs=pairs,
                    cap=kv_bound(v.kv_tokens, size, typical),
                    typical_out=drain_out,
                    life_s=slot_s.get(v.spec.name, 0.0),
                    pending=v.pending_prefill,
                    pending_pairs=v.pending_pairs,
                )
            seen = est.seen[d]
            cost -= (cost if cost > 0 else -cost) * bonus_table[seen if seen < top else top]
            scored.append(_Scored(v, est, cost, load, uncached, held, cell))
        return scored

    def _pick(
        self,
        request: RequestFeatures,
        candidates: Sequence[BackendView],
        scored: list[_Scored],
        d: int,
        cells: _Cells,
        out: float,
    ) -> tuple[_Scored, str]:
        """The least cost, ties broken at random; then exploration, else hysteresis (the module
        docstring). Returns the pick and why."""
        best: _Scored | None = None
        below, above = math.inf, -math.inf  # a cost below `below` is a new best, one up to `above` a tie
        ties = 0
        for s in scored:
            if s.cost < below:
                best, ties = s, 1
                # costs equal within 1e-9 (relative) are ties: identical backends at equal load
                tol = 1e-9 * (s.cost if s.cost > 0 else -s.cost) + 1e-12
                below, above = s.cost - tol, s.cost + tol
            elif s.cost <= above:
                ties += 1  # reservoir sampling: every tied candidate equally likely
                if self._rng.random() * ties < 1.0:
                    best = s
        if best is None:
            raise NoCandidate("no healthy backend")
        if self.epsilon and self._rng.random() < self.epsilon:
            best_e2e = self._cost(best.est, best.cell, best.load, best.uncached, out, best.view, request, own_only=True)
            explore = self._explore(cells, out, request, candidates, best.cost, best_e2e)
            if explore is not None and explore[0] is not best.view:
                return self._rescored(explore[0], explore[1], request, cells), "explore"
        incumbent = self._incumbent[d]
        inc = next((s for s in scored if s.view.spec.name == incumbent), None)
        if inc is not None and inc is not best and inc.load <= best.load:
            # Only a challenger that wins on estimates (not because the incumbent holds more
            # requests) must clear the margin: load balancing is not flapping.
            # An exact tie stays with the random tie-break: identical backends share traffic.
            size = inc.cost if inc.cost > 0 else -inc.cost
            if inc.cost - self.hysteresis * size <= best.cost < inc.cost - 1e-9 * size - 1e-12:
                return self._rescored(inc.view, inc.est, request, cells), "hold"
        self._incumbent[d] = best.view.spec.name
        return best, "best"

    def _rescored(self, v: BackendView, est: BackendEstimate, request: RequestFeatures, cells: _Cells) -> _Scored:
        """A pick other than the least cost, with its load and uncached prompt read afresh."""
        uncached = self._uncached(v, request)
        prompt = request.prompt_tokens
        held = (prompt - uncached) // TRACKED_TOKENS if uncached < prompt else 0
        cell = cells.on(v.spec.name)
        return _Scored(v, est, 0.0, view_load(v), uncached, held, cell)

    def _uncached(self, v: BackendView, request: RequestFeatures) -> int:
        if not request.prefix or self.prefixes is None or v.spec.name not in self.prefixes.backends:
            return request.prompt_tokens
        held = self.prefixes.backends[v.spec.name].depth(tracked(request.prefix))
        return max(request.prompt_tokens - held * TRACKED_TOKENS, 0)

    def _explore(
        self,
        cells: _Cells,
        out: float,
        request: RequestFeatures,
        candidates: Sequence[BackendView],
        best_cost: float,
        best_e2e: float,
    ) -> tuple[BackendView, BackendEstimate] | None:
        """The candidate chosen least recently among those not chosen for `explore_gap`
        decisions and whose cost, and this request's predicted e2e, are within 1/`explore_floor`
        of the best's: exploring a backend predicted 5x slower would cost a whole request for
        almost no chance of learning that it is the best one, and re-measuring one just measured
        teaches nothing."""
        if self.explore_floor:
            size = best_cost if best_cost > 0 else -best_cost
            ceiling = best_cost + (1.0 / self.explore_floor - 1.0) * size
            e2e_ceiling = best_e2e / self.explore_floor
        else:
            ceiling = e2e_ceiling = math.inf
        stale = self._tick - self.explore_gap
        pick: tuple[BackendView, BackendEstimate] | None = None
        for v in candidates:
            if not v.healthy:
                continue
            est = self.estimates.backends[v.spec.name]
            if est.last_chosen > stale:
                continue
            load, uncached = view_load(v), self._uncached(v, request)
            cell = cells.on(v.spec.name)
            if self._cost(est, cell, load, uncached, out, v, request) > ceiling:
                continue
            if self._cost(est, cell, load, uncached, out, v, request, own_only=True) > e2e_ceiling:
                continue
            if pick is None or est.last_chosen < pick[1].last_chosen:
                pick = (v, est)
        return pick

    def _cost(
        self,
        est: BackendEstimate,
        cell: int,
        load: int,
        uncached: int,
        out: float,
        v: BackendView,
        request: RequestFeatures,
        *,
        own_only: bool = False,
    ) -> float:
        """The objective's cost before the exploration bonus (the hot loop inlines this). With
        `own_only`, this request's own predicted seconds to its last token there instead: TTFT plus
        decode, nothing imposed on others, no weights."""
        if not est.observed:
            est = self.estimates.stand_in(est)
        pairs = causal_pairs(request.prompt_tokens, uncached)
        cap = kv_bound(v.kv_tokens, (request.prompt_tokens + out) * request.sequences, self._typical_tokens)
        life_s = self._slot_s.get(v.spec.name, 0.0)
        if own_only or self._latency:
            return own_and_imposed_s(
                est,
                cell,
                load,
                uncached,
                out,
                0.0 if own_only else self.externality,
                1.0 if own_only else self.ttft_weight,
                v.pending_prefill,
                math.inf if own_only else self.ttft_slo_s,
                0.0 if own_only else self.slo_weight,
                sequences=request.sequences,
                pairs=pairs,
                pending_pairs=v.pending_pairs,
                tpot_slo_s=math.inf if own_only else self.tpot_slo_s,
                cap=cap,
                typical_out=self._typical_out,
                life_s=life_s,
                residents=() if own_only else v.residents,
            )
        return -throughput_gain(
            est,
            cell,
            load,
            uncached,
            out,
            sequences=request.sequences,
            pairs=pairs,
            cap=cap,
            typical_out=self._typical_out,
            life_s=life_s,
            pending=v.pending_prefill,
            pending_pairs=v.pending_pairs,
        )

    # ------------------------------------------------------------------- learn

    def observe(self, outcome: Outcome) -> None:
        f = outcome.features
        copy = f is not None and f.copy_of != 0 and self._answered.get(f.copy_of) == outcome.backend
        if f is not None and f.prompt_key and outcome.error is None:
            self._remember_answer(f.prompt_key, outcome.backend)  # a pinned request's too
        self.estimates.observe(outcome, copy=copy)
        self.lengths.observe(outcome)
        held = outcome.decode_s
        if held is not None and held > 0 and outcome.error is None and math.isfinite(held):
            name = outcome.backend
            last = self._slot_s.get(name)
            if last is not None:
                self._slot_s[name] = last + _TYPICAL_ALPHA * (held - last)
            elif name in self.estimates.backends:  # bounded: only backends the policy knows
                self._slot_s[name] = held

    def seed(self, backend: BackendSpec, measurement: Measurement) -> None:
        """Replace what the strategy's prior says about `backend` with a measurement of it
        (`specroute` takes one at startup): no backend starts with the studies' figures as a
        head start or a handicap."""
        est = self.estimates.register(backend.name, backend.strategy)
        if isinstance(est, BackendEstimate):
            est.seed(measurement)

    def forget_prefixes(self, backend: str) -> None:
        """The backend restarted (its radix cache is empty) or left the pool."""
        if self.prefixes is not None:
            self.prefixes.forget(backend)

    # ------------------------------------------------------------------- introspect

    def describe(self, candidates: Sequence[BackendView] | None = None) -> dict[str, Any]:
        """Per backend: acceptance per domain (and per cell), step time and request tok/s per load
        bucket, prefill speed, tracked prefix blocks, and (given the current views) the predicted
        tok/s of a new request per domain right now. Plain dicts, for `/admin/backends`."""
        out: dict[str, Any] = self.estimates.describe()
        for v in candidates or ():
            est = self.estimates.backends.get(v.spec.name) or self._register(v)
            load = view_load(v)
            entry = out.setdefault(v.spec.name, est.describe())
            entry["load"] = load
            entry["pending_prefill"] = v.pending_prefill
            entry["pending_pairs"] = v.pending_pairs
            entry["prefilled_tokens"] = v.prefilled_tokens
            entry["prefilled_prompts"] = v.prefilled_prompts
            entry["residents"] = len(v.residents)
            entry["residents_decoding"] = sum(1 for r in v.residents if r.decoding)
            entry["predicted_tok_s"] = {dom.value: round(est.rate(i, load + 1), 1) for i, dom in enumerate(DOMAINS)}
        if self.prefixes is not None:
            for name, blocks in self.prefixes.describe().items():
                if name in out:
                    out[name]["prefix_blocks"] = blocks
        out_meta = {
            "objective": self.objective,
            "externality": self.externality,
            "ttft_slo_s": None if math.isinf(self.ttft_slo_s) else self.ttft_slo_s,
            "tpot_slo_s": None if math.isinf(self.tpot_slo_s) else self.tpot_slo_s,
            "slo_weight": self.slo_weight,
            "decisions": self._tick,
            "telemetry_used": self.estimates.used,
            "telemetry_skipped": dict(self.estimates.skipped),
            **self.lengths.describe(),
        }
        return {"policy": out_meta, "backends": out}

    def _register(self, v: BackendView) -> BackendEstimate:
        return self.estimates.register(v.spec.name, v.spec.strategy, v.max_running)
