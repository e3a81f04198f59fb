"""Live estimates of how fast each backend decodes, learned from finished requests.

Decode speed of one request is (tokens per verify pass) / (seconds per pass). The two factors
move for different reasons, so they are learned separately: acceptance per prompt domain
(`policies.acceptance`: flat in load, the vLLM measurement of docs/studies.md) and step time per
load (`policies.steptime`: grows with the batch). Their quotient, at the load a request would
find, is what the goodput policy ranks backends by.

Everything is O(1) per update and per lookup with a fixed amount of memory per backend. Garbage
telemetry (errors, missing or non-finite fields) is skipped and counted, never raised: a broken
upstream must not break routing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from backends import BackendSpec, Strategy
from backends.measure import Measurement
from policies.acceptance import Acceptance, ShapeGroup
from policies.base import Domain, Outcome
from policies.prefill import PrefillModel, causal_pairs
from policies.priors import (
    CELLS_PER_DOMAIN,
    DEFAULT_PRIORS,
    DOMAIN_INDEX,
    DOMAINS,
    StrategyPrior,
    cell_of,
    cell_priors,
    prior_for,
)
from policies.server_counters import CounterWindows
from policies.steptime import BUCKETS, StepCurve

__all__ = ["BUCKETS", "BackendEstimate", "Estimates"]

_MAX_ACCEPT = 64.0  # no drafter verifies more tokens per pass
_MIN_STEP_S, _MAX_STEP_S = 1e-5, 60.0
_FULL_SAMPLE_PASSES = 64  # a request of this many decode passes or more is a full step-time sample


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# What a RateModel without a prefill model of its own predicts (the strategies' shared prior).
_PREFILL_BASE_S = DEFAULT_PRIORS[Strategy.AR].prefill_base_s
_PREFILL_PER_TOKEN_S = DEFAULT_PRIORS[Strategy.AR].prefill_per_token_s
_PREFILL_PAIR_S = DEFAULT_PRIORS[Strategy.AR].prefill_pair_s


class RateModel:
    """Decode speed from acceptance per domain (`_acc`), step time per load (`step_s`) and the
    cap (`max_running`): the live estimate and the evaluator's oracle predict alike. The cost
    model also asks for acceptance per cell (`accept_at`) and prefill time (`prefill_s`,
    `prefill_stall_s`); a subclass that knows no better answers with the per-domain figure and
    the prior."""

    __slots__ = ()
    _acc: list[float]
    max_running: int

    def step_s(self, load: int) -> float:  # provided by the subclass (an attribute or a method)
        raise NotImplementedError

    def accept_at(self, c: int) -> float:
        """Tokens per verify pass of a request in acceptance cell `c` (`policies.priors.cell_of`)."""
        return self._acc[c // CELLS_PER_DOMAIN]

    def prefill_s(self, uncached: int, pairs: float = 0.0) -> float:
        """Seconds from dispatch to first token when `uncached` prompt tokens must be prefilled,
        `pairs` causal (query, key) pairs of attention among them (`policies.prefill.causal_pairs`)."""
        return _PREFILL_BASE_S + _PREFILL_PER_TOKEN_S * uncached + _PREFILL_PAIR_S * pairs

    def prefill_stall_s(self, uncached: int, pairs: float = 0.0) -> float:
        """Seconds a prefill of `uncached` tokens holds up the decode of the requests running
        beside it (its tokens ride in their passes; the fixed part of an idle prefill does not)."""
        return _PREFILL_PER_TOKEN_S * uncached + _PREFILL_PAIR_S * pairs

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

    __slots__ = (
        "name",
        "strategy",
        "speculative",
        "prior",
        "max_running",
        "acceptance",
        "curve",
        "step_s",
        "step_memo",
        "_acc",
        "_cells",
        "prefill",
        "seen",
        "last_chosen",
        "last_report",
        "observed",
        "last_step_s",
        "last_tok_s",
        "counters",
        "server_steps",
        "last_moments",
        "last_prefill_counters",
    )

    def __init__(
        self,
        name: str,
        strategy: Strategy,
        prior: StrategyPrior,
        *,
        max_running: int | None = None,
        step_alpha: float = 0.2,
        shape: ShapeGroup | None = None,
    ) -> None:
        self.name = name
        self.strategy = strategy
        self.speculative = strategy.speculative
        self.prior = prior
        self.max_running = max_running or prior.max_running
        self.acceptance = Acceptance(cell_priors(prior), shape)
        self.curve = StepCurve(prior.step, self.max_running, step_alpha)
        self.step_s = self.curve.step_s  # type: ignore[method-assign]  # bound method: hot path
        self.step_memo = self.curve.memo  # step_s per load, 0.0 = not computed (same list, cleared in place)
        self._acc = self.acceptance.values  # same lists, updated in place
        self._cells = self.acceptance.cells
        self.prefill = PrefillModel(prior.prefill_base_s, prior.prefill_per_token_s, prior.prefill_pair_s)
        self.seen = [0] * len(DOMAINS)  # usable outcomes per domain (drives the exploration bonus)
        self.last_chosen = 0  # decision tick of the last time a policy sent a request here
        self.last_report: float | None = None
        self.observed = 0
        self.last_step_s: float | None = None
        self.last_tok_s: float | None = None
        self.counters = CounterWindows()
        self.server_steps = 0  # step-time windows from the server's own counters
        self.last_moments: tuple[float, ...] | None = None  # the report last read (compared by identity)
        self.last_prefill_counters: tuple[float, float] | None = None

    # ---------------------------------------------------------------- lookups (hot path)

    def accept_length(self, d: int) -> float:
        """Predicted tokens per verify pass for domain index `d` (1.0 for AR)."""
        return self._acc[d]

    def accept_at(self, c: int) -> float:
        return self._cells[c]

    def prefill_s(self, uncached: int, pairs: float = 0.0) -> float:
        """An idle backend's TTFT: one forward pass of its own (priced as a decode pass at batch 1,
        so that it scales with the machine the step curve has measured) plus the prompt's tokens
        and their attention's pairs."""
        pre = self.prefill
        return self.step_s(1) + pre.per_token_s * uncached + pre.pair_s * pairs

    def prefill_stall_s(self, uncached: int, pairs: float = 0.0) -> float:
        pre = self.prefill
        return pre.per_token_s * uncached + pre.pair_s * pairs

    # ------------------------------------------------------------------------ updates

    def seed(self, m: Measurement) -> None:
        """A measurement of this backend replaces its prior (`backends.measure`); implausible
        figures are ignored one by one."""
        bad = " ".join(m.problems())
        if m.step_s is not None and "step_s" not in bad:
            self.curve.observe(1.0, m.step_s)
            self.observed += 1
        if self.speculative and m.accept_length:
            measured = {
                DOMAIN_INDEX[Domain(dom)]: x for dom, x in m.accept_length.items() if f"accept_length[{dom}]" not in bad
            }
            self.acceptance.seed(measured)
            for d in measured:
                self.seen[d] = max(self.seen[d], 1)
        if m.prefill_base_s is not None and m.prefill_per_token_s is not None and "prefill" not in bad:
            self.prefill.reset(m.prefill_base_s, m.prefill_per_token_s)

    def set_max_running(self, max_running: int) -> None:
        """The backend's `max_running_requests` as it reports it (`/server_info`)."""
        self.max_running = max_running
        self.curve.max_running = max_running

    def note_dispatch(self, c: int) -> None:
        """A request of acceptance cell `c` was sent here."""
        self.acceptance.note_dispatch(c)

    def note_idle(self) -> None:
        self.acceptance.note_idle()

    def note_counters(
        self,
        moments: tuple[float, ...] | None,
        prefill: tuple[float, float] | None,
        own: tuple[float, float, float] | None = None,
    ) -> None:
        """A new poll of the server's own counters (`BackendView.decode_moments`,
        `prefill_counters`, and `prefilled_at_report`, the gateway's own prefilled tokens, pairs and
        prompts at that poll): each closed window is a clean sample of step time at its mean batch, and of
        prefill seconds per token at its prompts' pairs per token. Once the server measures its
        steps, requests' own decode timing (which carries other requests' prefills) no longer moves
        the step curve."""
        if moments is not None and moments is not self.last_moments:
            self.last_moments = moments
            got = self.counters.decode(moments)
            if got is not None and _MIN_STEP_S <= got[1] <= _MAX_STEP_S:
                self.server_steps += 1
                self.curve.observe(got[0], got[1])
                self.observed += 1
        if prefill is not None and prefill is not self.last_prefill_counters:
            self.last_prefill_counters = prefill
            rate = self.counters.prefill(prefill[0], prefill[1], own)
            if rate is not None:
                self.prefill.observe_rate(*rate)

    def note_report(self, reported_accept: float, running: int | None) -> None:
        self.last_report = reported_accept
        if self.speculative:
            self.acceptance.note_report(reported_accept, running)

    def observe(self, outcome: Outcome, copy: bool = False) -> str | None:
        """Learn from one finished request; returns why it was skipped, or None if used. `copy`: a
        copy-heavy turn that ran on the backend that generated the text it copies (its copy cell)."""
        d = DOMAIN_INDEX.get(outcome.domain)
        if d is None:
            try:
                d = DOMAIN_INDEX[Domain(outcome.domain)]
            except ValueError:
                return "bad_domain"
        f = outcome.features
        c = cell_of(
            d,
            f.temperature if f is not None else None,
            f.prompt_tokens if f is not None else outcome.prompt_tokens,
            copy,
        )
        self.acceptance.note_done(c)  # finished, failed or garbled: no longer in flight
        if outcome.error:
            return "error"
        n, k = outcome.completion_tokens, outcome.sequences  # n: over all k sequences
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            return "bad_sequences"
        if not isinstance(n, int) or isinstance(n, bool) or n < 2 * k:
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
            passes = verify_ct / k  # the sequences advance in the same passes
        else:
            passes = n / k - 1
        step = decode_s / passes  # type: ignore[operator]
        if not _MIN_STEP_S <= step <= _MAX_STEP_S:
            return "bad_step"
        if accept is not None:
            self.acceptance.observe(c, accept, verify_ct)
        if not self.server_steps:
            self._observe_step(load, step, passes)  # type: ignore[arg-type]
        self._observe_prefill(outcome)
        self.seen[d] += 1
        self.observed += 1
        self.last_step_s = step
        self.last_tok_s = (n / k - 1) / decode_s  # type: ignore[operator]
        return None

    def _observe_step(self, load: float, step: float, passes: float) -> None:
        # Weighed by passes, so that the curve is a ratio estimate (seconds over passes) and not a
        # mean of per-request ratios: a 24-token tool call decodes in ~5 passes, and one of them
        # carrying another request's 16k-token prefill chunk (2 s) makes its step time 10x.
        w = passes / _FULL_SAMPLE_PASSES
        self.curve.observe(float(load), step, w if w < 1.0 else 1.0)

    def _observe_prefill(self, outcome: Outcome) -> None:
        """Learn prefill speed from TTFT, in the units the cost model predicts with (the gateway's
        prompt estimate in `features`), scaled by the share of the prompt the server says it did
        not have cached. Only a one-sequence request dispatched to an idle backend teaches it
        (`policies.prefill`: elsewhere a TTFT is mostly waiting behind others), and not one whose
        cache hit is unknown while it carried a conversation prefix."""
        ttft = outcome.ttft_s
        at = outcome.inflight_at_dispatch
        if not _finite(ttft) or not isinstance(at, int) or at != 1 or outcome.sequences != 1:
            return
        f = outcome.features
        real = outcome.prompt_tokens if isinstance(outcome.prompt_tokens, int) else 0
        estimate = f.prompt_tokens if f is not None and f.prompt_tokens > 0 else real
        cached = outcome.cached_tokens
        if cached is None:
            if f is not None and f.prefix:
                return
            cached = 0
        if not isinstance(cached, int) or cached < 0:
            return
        share = (real - cached) / real if real > 0 and cached <= real else 1.0
        uncached = round(estimate * share)
        self.prefill.observe(float(ttft), uncached, causal_pairs(estimate, uncached))  # type: ignore[arg-type]

    # --------------------------------------------------------------------- reporting

    def describe(self) -> dict[str, Any]:
        """Plain-dict snapshot for `/admin/backends` and eval reports."""
        out: dict[str, Any] = {
            "strategy": self.strategy.value,
            "max_running": self.max_running,
            "observed": self.observed,
            "step_server_windows": self.server_steps,
        }
        out.update(
            self.acceptance.describe() if self.speculative else {"accept_length": {dom.value: 1.0 for dom in DOMAINS}}
        )
        out.update(self.curve.describe())
        out.update(self.prefill.describe())
        out["request_tok_s"] = {
            dom.value: {str(b): round(self.rate(i, b), 1) for b in BUCKETS} for i, dom in enumerate(DOMAINS)
        }
        return out


class Estimates:
    """Estimates of every backend a policy has seen, keyed by backend name."""

    def __init__(self, priors: Mapping[Strategy, StrategyPrior] = DEFAULT_PRIORS, *, step_alpha: float = 0.2) -> None:
        self.priors = priors
        self.step_alpha = step_alpha
        self.backends: dict[str, BackendEstimate] = {}
        # the relative acceptance per cell, one per strategy (`policies.acceptance.ShapeGroup`)
        self.shapes: dict[Strategy, ShapeGroup] = {}
        self.used = 0
        self.skipped: dict[str, int] = {}
        self._ar_peer: tuple[int, int, BackendEstimate | None] = (-1, -1, None)  # (used, backends, peer)

    def register(self, name: str, strategy: Strategy | str, max_running: int | None = None) -> BackendEstimate:
        """The estimate of `name`, created from its strategy's prior on first sight."""
        est = self.backends.get(name)
        if est is None:
            try:
                strat = Strategy(strategy)
            except ValueError:
                strat = Strategy.AR
            prior = prior_for(strat, self.priors)
            shape = self.shapes.get(strat)
            if shape is None:
                shape = self.shapes[strat] = ShapeGroup(cell_priors(prior))
            est = BackendEstimate(name, strat, prior, max_running=max_running, step_alpha=self.step_alpha, shape=shape)
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
        used, count, peer = self._ar_peer
        if used != self.used or count != len(self.backends):  # what was measured changed
            peer = None
            for other in self.backends.values():
                if not other.speculative and other.observed and (peer is None or other.observed > peer.observed):
                    peer = other
            self._ar_peer = (self.used, len(self.backends), peer)
        return peer if peer is not None and peer.observed > est.observed else est

    def observe(self, outcome: Outcome, copy: bool = False) -> bool:
        """Feed one telemetry record; False (and a counted reason) when it was unusable. `copy`: as
        `BackendEstimate.observe`."""
        try:
            est = self.backends.get(outcome.backend)
            reason = "unknown_backend" if est is None else est.observe(outcome, copy)
        except Exception:  # telemetry must never break routing
            reason = "malformed"
        if reason is None:
            self.used += 1
            return True
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        return False

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: est.describe() for name, est in self.backends.items()}
