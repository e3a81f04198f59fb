"""A fast steady-state model of a fleet on a phase's traffic: the planner's first, coarse ranking.

Simulating every fleet composition on the virtual clock takes seconds each; there are C(N+T-1, N)
compositions of N servers over T server types (1287 for 8 servers over 6). So `plan` ranks them all
with this model first and simulates only the best few (`evaluate.plan`).

Per server type and phase, from a sample of the phase's requests (its sessions drawn as the
simulator draws them, each turn's cached part as if its conversation stayed on one server; a
trace's requests spread evenly over its window, each cached as far as one server's KV pool, an
LRU over the trace's blocks in arrival order, would still hold its prefix):
- acceptance per request from the engine's own `accept_prob` (domain, prompt, temperature, context
  length) and its truncated geometric law; prefill of the uncached part from `prefill_time`;
- at n requests in flight the step time `step_time(min(n, cap), KV of n requests)`, stretched by
  the prefill the arrivals bring: a prompt's prefill rides along the running batch's pass (SGLang's
  mixed chunked prefill) and lengthens it, so at x requests/s a share x E[prefill] of the server's
  time is prefill and the passes run at (1 - that share) of their unloaded pace; a request's
  decode rate is its acceptance / the stretched step time;
- the load n a per-server arrival rate x brings comes from Little's law, n = x E[T(n)], with T a
  request's prefill + decode time at load n (solved by bisection; n is capped by `max_running` and
  by how many requests' KV reservations fit, beyond which the server is saturated: a speculative
  SGLang server's cap of 48 binds where an AR server's larger batch still absorbs the load).
That gives each type a curve F(x) = x * mean request tok/s at per-server rate x. A fleet with k_t
servers of type t serves the phase's rate best when the rate is split so that marginal gains are
equal (water-filling, in small increments): the value is sum_t k_t F_t(x_t) / rate, the mean
request tok/s of an ideal domain-blind router. It ignores what per-request routing adds (domain,
temperature and cache affinity) and burstiness: that is what the simulation of the short list
measures. Beyond the fleet's saturation the excess is shed and counts 0.
"""

from __future__ import annotations

import collections
import functools
import heapq
import random
from collections.abc import Sequence

import msgspec
import numpy as np

from evaluate.clairvoyant import expected_accept
from evaluate.fleet import Member
from evaluate.scenarios import Phase, Scenario
from evaluate.sources import TraceSource
from evaluate.workload import Mix, Turn, draw_session, single_request
from loadgen.trace_file import BLOCK_TOKENS
from twin.domain import prompt_key
from twin.engine import Engine
from twin.prefix_cache import PREFIX_BLOCK_TOKENS

__all__ = ["GRID", "PhaseGrid", "TypeCurve", "fleet_value", "request_rates", "type_curve"]

GRID = 48  # points of a type's curve between 0 and its saturation rate
SAMPLE_SESSIONS = 240
STEPS = 120  # water-filling increments of the phase's rate


class _Sample(msgspec.Struct, frozen=True):
    domain: str
    key: int
    temperature: float
    prompt: int
    cached: int
    tokens: int
    top_p: float = 1.0


@functools.lru_cache(maxsize=64)
def _samples(
    phase_json: bytes,
    min_tokens: int,
    max_tokens: int,
    reasoning_json: bytes,
    prompt_tokens: tuple[int, int] = (50, 400),
    kv_tokens: int = 0,
) -> tuple[_Sample, ...]:
    from twin.thinking import ReasoningModel

    ph = msgspec.json.decode(phase_json, type=Phase)
    if isinstance(ph.source, TraceSource):
        return _trace_samples(ph.source, kv_tokens)
    reasoning = msgspec.json.decode(reasoning_json, type=ReasoningModel | None)
    domains = list(ph.domains)
    weights = [ph.domains[d] for d in domains]
    out = []
    for i in range(SAMPLE_SESSIONS):
        tag = f"fluid:{ph.name}:{i}"
        if ph.source is not None:
            s = ph.source.session(tag, i, 0)
        elif ph.mix is None:
            rng = random.Random(tag)
            s = single_request(
                tag, rng.choices(domains, weights)[0], rng.randint(*prompt_tokens), rng.randint(min_tokens, max_tokens)
            )
        else:
            s = draw_session(tag, ph.mix, domains, weights, (min_tokens, max_tokens), reasoning)
        prev: tuple[int, ...] = ()
        for t in s.turns:
            shared = 0
            for a, b in zip(t.chain, prev, strict=False):
                if a != b:
                    break
                shared += 1
            out.append(_sample(t, shared * PREFIX_BLOCK_TOKENS))
            prev = t.output_chain
    return tuple(out)


def _trace_samples(source: TraceSource, kv_tokens: int) -> tuple[_Sample, ...]:
    """SAMPLE_SESSIONS requests spread evenly over the trace, with the prefix one server's pool of
    `kv_tokens` would still hold for each (`_trace_hits`)."""
    rows = source.trace.rows
    hits = _trace_hits(source, kv_tokens)
    picks = sorted({round(j * (len(rows) - 1) / max(1, SAMPLE_SESSIONS - 1)) for j in range(SAMPLE_SESSIONS)})
    out = []
    for i in picks:
        (t,) = source.session(f"fluid:trace:{i}", i, 0).turns
        out.append(_sample(t, hits[i]))
    return tuple(out)


def _sample(t: Turn, cached: int) -> _Sample:
    """A turn as the fluid model sees it, `cached` tokens of its prompt already on the server."""
    cached = min(cached, t.prompt_tokens - 1)
    return _Sample(t.domain, prompt_key(t.tag), t.temperature, t.prompt_tokens, cached, t.max_tokens, t.top_p)


@functools.lru_cache(maxsize=16)
def _trace_hits(source: TraceSource, kv_tokens: int) -> tuple[int, ...]:
    """Per request of the trace, the tokens of its prompt an LRU pool of `kv_tokens` (whole trace
    blocks) holds when it arrives, the requests before it having been inserted in order."""
    pool: collections.OrderedDict[int, None] = collections.OrderedDict()
    capacity = max(1, kv_tokens // BLOCK_TOKENS)
    out = []
    for row in source.trace.rows:
        n = 0
        for b in row.blocks:
            if b not in pool:
                break
            n += 1
        out.append(min(n * BLOCK_TOKENS, row.input_tokens))
        for b in reversed(row.blocks):  # the leaf first: a prefix is never older than its extensions
            pool[b] = None
            pool.move_to_end(b)
        while len(pool) > capacity:
            pool.popitem(last=False)
    return tuple(out)


class TypeCurve(msgspec.Struct, frozen=True, kw_only=True):
    """One server type on one phase: F(x) = x * mean request tok/s, on a grid of x up to saturation."""

    rates: tuple[float, ...]  # per-server requests/s
    values: tuple[float, ...]  # F at those rates
    saturation_rps: float

    def value_at(self, x: float) -> float | None:
        """F(x) by linear interpolation; None beyond saturation."""
        if x > self.saturation_rps * (1 + 1e-9):
            return None
        return float(np.interp(x, self.rates, self.values))


def request_rates(member: Member, scenario: Scenario, phase: Phase, x: float) -> np.ndarray | None:
    """Each sampled request's decode tok/s on a server of `member` serving x requests/s of the
    phase (the load Little's law gives), in sample order; None beyond saturation."""
    rates = _rates_at(member, msgspec.json.encode(phase), scenario.min_tokens, scenario.max_tokens, round(x, 6))
    return np.array(rates) if rates is not None else None


@functools.lru_cache(maxsize=512)
def _rates_at(
    member: Member, phase_json: bytes, min_tokens: int, max_tokens: int, x: float
) -> tuple[float, ...] | None:
    model = _model(member, phase_json, min_tokens, max_tokens)
    n = model.load_for(x)
    return None if n is None else tuple(model.rates(n, x))


def type_curve(member: Member, scenario: Scenario, phase: Phase) -> TypeCurve:
    return _curve(member, msgspec.json.encode(phase), scenario.min_tokens, scenario.max_tokens)


class _Model:
    """One server type on one phase's sampled requests: rates and Little's-law load."""

    def __init__(self, member: Member, phase_json: bytes, min_tokens: int, max_tokens: int) -> None:
        engine = Engine(member.build_profile(), seed=0)
        samples = _samples(
            phase_json,
            min_tokens,
            max_tokens,
            msgspec.json.encode(engine.profile.reasoning),
            kv_tokens=engine.profile.max_total_num_tokens,
        )
        m = engine.profile.max_accept_drafts
        self.engine = engine
        self.acc = np.array(
            [
                expected_accept(
                    engine.accept_prob(
                        s.domain, s.key, temperature=s.temperature, top_p=s.top_p, context_tokens=s.prompt
                    )
                    * member.accept_scale,
                    m,
                )
                for s in samples
            ]
        )
        # next to a running batch a prefill costs its tokens only (it rides along the pass)
        self.prefill = np.array([engine.prefill_time(s.prompt - s.cached, 1, s.cached) for s in samples])
        self.prefill_share = float(np.mean(self.prefill))  # server seconds of prefill per arrival
        self.tokens = np.array([float(s.tokens) for s in samples])
        self.kv_mean = float(np.mean([s.prompt + s.tokens / 2 for s in samples]))
        reserve = float(np.mean([s.prompt + s.tokens for s in samples]))
        self.cap = engine.max_running
        self.n_max = max(1.0, min(float(self.cap), engine.profile.max_total_num_tokens / reserve))

    def rates(self, n: float, x: float) -> np.ndarray:
        """Each request's decode tok/s with n requests in flight at x arrivals/s: its acceptance
        over the step time, stretched by the share of the server's time the arrivals' prefill takes."""
        b = max(1, min(round(n), self.cap))
        return (
            self.acc
            * max(0.0, 1.0 - x * self.prefill_share)
            / self.engine.step_time(b, kv_tokens=int(b * self.kv_mean))
        )

    def at_load(self, n: float, x: float) -> tuple[float, float]:
        """(mean request tok/s, mean request time) with n requests in flight at x arrivals/s."""
        rate = self.rates(n, x)
        if not np.all(rate > 0):
            return 0.0, float("inf")
        return float(np.mean(rate)), float(np.mean(self.prefill + self.tokens / rate))

    def load_for(self, x: float) -> float | None:
        if x <= 0:
            return 1.0
        lo, hi = 0.0, self.n_max
        if x * self.at_load(hi, x)[1] > hi:
            return None
        for _ in range(30):
            mid = (lo + hi) / 2
            if x * self.at_load(mid, x)[1] > mid:
                lo = mid
            else:
                hi = mid
        return hi

    def saturation(self) -> float:
        """The largest arrival rate whose Little's-law load fits under n_max (bisection: the
        load x T(n_max, x) grows with x, and prefill alone fills the server at 1 / E[prefill])."""
        lo, hi = (
            0.0,
            1.0 / self.prefill_share if self.prefill_share > 0 else self.n_max / self.at_load(self.n_max, 0.0)[1],
        )
        for _ in range(40):
            mid = (lo + hi) / 2
            if mid * self.at_load(self.n_max, mid)[1] <= self.n_max:
                lo = mid
            else:
                hi = mid
        return lo


@functools.lru_cache(maxsize=512)
def _model(member: Member, phase_json: bytes, min_tokens: int, max_tokens: int) -> _Model:
    return _Model(member, phase_json, min_tokens, max_tokens)


@functools.lru_cache(maxsize=512)
def _curve(member: Member, phase_json: bytes, min_tokens: int, max_tokens: int) -> TypeCurve:
    model = _model(member, phase_json, min_tokens, max_tokens)
    sat = model.saturation()
    rates = [sat * j / GRID for j in range(GRID + 1)]
    values = []
    for x in rates:
        n = model.load_for(x)
        values.append(x * model.at_load(n if n is not None else model.n_max, x)[0])
    return TypeCurve(rates=tuple(rates), values=tuple(values), saturation_rps=sat)


class PhaseGrid:
    """Each type's curve sampled at multiples of rate / STEPS, for valuing many fleets on one phase."""

    def __init__(self, curves: Sequence[TypeCurve], rate: float) -> None:
        self.rate = rate
        self.saturations = [c.saturation_rps for c in curves]
        h = rate / STEPS if rate > 0 else 0.0
        self.marginals: list[list[float]] = []
        for c in curves:
            if h <= 0:
                self.marginals.append([])
                continue
            steps = min(STEPS, int(c.saturation_rps / h + 1e-9))
            xs = np.arange(steps + 1) * h
            f = np.interp(xs, c.rates, c.values)
            self.marginals.append([float(v) for v in np.diff(f)])

    def value(self, counts: Sequence[int]) -> float:
        """Mean request tok/s with counts[t] servers of type t: STEPS increments of the rate, each
        to the server whose F grows most (greedy water-filling). Increments beyond every server's
        saturation are shed and count 0 (the simulator's scoring: shed requests are no speed)."""
        if self.rate <= 0:
            return 0.0
        heap = []
        for t, k in enumerate(counts):
            m = self.marginals[t]
            if k and m:
                for s in range(k):
                    heap.append((-m[0], t, s, 0))
        heapq.heapify(heap)
        total = 0.0
        for _ in range(STEPS):
            if not heap:  # saturated: what is left is shed, and a shed request counts 0
                break
            neg, t, s, j = heapq.heappop(heap)
            total -= neg
            m = self.marginals[t]
            if j + 1 < len(m):
                heapq.heappush(heap, (-m[j + 1], t, s, j + 1))
        return float(total / self.rate)

    def headroom(self, counts: Sequence[int]) -> float:
        """The fleet's capacity over the phase's rate: its servers' saturation rates summed, over
        the rate. Below 1 the excess queues without bound (or is shed), whatever the split."""
        if self.rate <= 0:
            return float("inf")
        return sum(k * s for k, s in zip(counts, self.saturations, strict=True)) / self.rate


def fleet_value(curves: list[tuple[int, TypeCurve]], rate: float) -> float:
    """Mean request tok/s of `rate` requests/s over k servers of each curve's type, split by
    water-filling; what no split can carry counts 0."""
    grid = PhaseGrid([c for _, c in curves], rate)
    return grid.value([k for k, _ in curves])


def mix_of(phase: Phase) -> Mix:
    return phase.mix or Mix()
