"""A fast steady-state model of a fleet on a phase's traffic: the planner's first, coarse ranking.

Simulating every fleet composition on the virtual clock takes seconds each; there are C(N+T-1, N)
compositions of N servers over T server types (1287 for 8 servers over 6). So `plan` ranks them all
with this model first and simulates only the best few (`policies.eval.plan`).

Per server type and phase, from a sample of the phase's requests (its sessions drawn as the
simulator draws them, each turn's cached part as if its conversation stayed on one server):
- acceptance per request from the engine's own `accept_prob` (domain, prompt, temperature, context
  length) and its truncated geometric law; prefill of the uncached part from `prefill_time`;
- at n requests in flight the step time `step_time(min(n, cap), KV of n requests)`, so a request's
  decode rate is its acceptance / that step time;
- the load n a per-server arrival rate x brings comes from Little's law, n = x E[T(n)], with T a
  request's prefill + decode time at load n (solved by bisection; n is capped by `max_running` and
  by how many requests' KV reservations fit, beyond which the server is saturated).
That gives each type a curve F(x) = x * mean request tok/s at per-server rate x. A fleet with k_t
servers of type t serves the phase's rate best when the rate is split so that marginal gains are
equal (water-filling, in small increments): the value is sum_t k_t F_t(x_t) / rate, the mean
request tok/s of an ideal domain-blind router. It ignores what per-request routing adds (domain,
temperature and cache affinity) and burstiness: that is what the simulation of the short list
measures. A rate no allocation can carry scores 0.
"""

from __future__ import annotations

import functools
import random

import msgspec
import numpy as np

from backends.sim.domain import prompt_key
from backends.sim.engine import Engine
from backends.sim.prefix_cache import PREFIX_BLOCK_TOKENS
from policies.eval.clairvoyant import expected_accept
from policies.eval.fleet import Member
from policies.eval.scenarios import Phase, Scenario
from policies.eval.workload import Mix, draw_session, single_request

__all__ = ["GRID", "TypeCurve", "fleet_value", "type_curve"]

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


@functools.lru_cache(maxsize=64)
def _samples(phase_json: bytes, min_tokens: int, max_tokens: int, reasoning_json: bytes) -> tuple[_Sample, ...]:
    from backends.sim.thinking import ReasoningModel

    ph = msgspec.json.decode(phase_json, type=Phase)
    reasoning = msgspec.json.decode(reasoning_json, type=ReasoningModel | None)
    domains = list(ph.domains)
    weights = [ph.domains[d] for d in domains]
    out = []
    for i in range(SAMPLE_SESSIONS):
        tag = f"fluid:{ph.name}:{i}"
        if ph.mix is None:
            rng = random.Random(tag)
            s = single_request(tag, rng.choices(domains, weights)[0], rng.randint(50, 400),
                               rng.randint(min_tokens, max_tokens))
        else:
            s = draw_session(tag, ph.mix, domains, weights, (min_tokens, max_tokens), reasoning)
        prev: tuple[int, ...] = ()
        for t in s.turns:
            shared = 0
            for a, b in zip(t.chain, prev, strict=False):
                if a != b:
                    break
                shared += 1
            out.append(_Sample(t.domain, prompt_key(t.tag), t.temperature, t.prompt_tokens,
                               min(shared * PREFIX_BLOCK_TOKENS, t.prompt_tokens - 1), t.max_tokens))
            prev = t.output_chain
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


def type_curve(member: Member, scenario: Scenario, phase: Phase) -> TypeCurve:
    return _curve(member, msgspec.json.encode(phase), scenario.min_tokens, scenario.max_tokens)


@functools.lru_cache(maxsize=512)
def _curve(member: Member, phase_json: bytes, min_tokens: int, max_tokens: int) -> TypeCurve:
    engine = Engine(member.build_profile(), seed=0)
    reasoning = engine.profile.reasoning
    samples = _samples(phase_json, min_tokens, max_tokens, msgspec.json.encode(reasoning))
    m = engine.profile.max_accept_drafts
    acc = np.array([expected_accept(engine.accept_prob(s.domain, s.key, temperature=s.temperature,
                                                       context_tokens=s.prompt) * member.accept_scale, m)
                    for s in samples])
    prefill = np.array([engine.prefill_time(s.prompt - s.cached, 1, s.cached) for s in samples])
    tokens = np.array([float(s.tokens) for s in samples])
    kv_mean = float(np.mean([s.prompt + s.tokens / 2 for s in samples]))
    reserve = float(np.mean([s.prompt + s.tokens for s in samples]))
    cap = engine.max_running
    n_max = max(1.0, min(float(cap), engine.profile.max_total_num_tokens / reserve))

    def at_load(n: float) -> tuple[float, float]:
        """(mean request tok/s, mean request time) with n requests in flight."""
        b = max(1, min(round(n), cap))
        step = engine.step_time(b, kv_tokens=int(b * kv_mean))
        rate = acc / step
        return float(np.mean(rate)), float(np.mean(prefill + tokens / rate))

    def load_for(x: float) -> float | None:
        lo, hi = 0.0, n_max
        if x * at_load(hi)[1] > hi:
            return None
        for _ in range(30):
            mid = (lo + hi) / 2
            if x * at_load(mid)[1] > mid:
                lo = mid
            else:
                hi = mid
        return hi

    # saturation: the largest x whose Little's-law load fits under n_max
    sat = n_max / at_load(n_max)[1]
    rates = [sat * j / GRID for j in range(GRID + 1)]
    values = []
    for x in rates:
        n = load_for(x) if x > 0 else 1.0
        values.append(x * at_load(n if n is not None else n_max)[0])
    return TypeCurve(rates=tuple(rates), values=tuple(values), saturation_rps=sat)


def fleet_value(curves: list[tuple[int, TypeCurve]], rate: float) -> float:
    """Mean request tok/s of `rate` requests/s over k servers of each curve's type, split by
    water-filling; 0 when no split can carry the rate."""
    if rate <= 0:
        return 0.0
    x = [0.0] * len(curves)
    f = [0.0] * len(curves)
    step = rate / STEPS
    for _ in range(STEPS):
        best, best_gain, best_f = -1, -np.inf, 0.0
        for i, (k, c) in enumerate(curves):
            nf = c.value_at(x[i] + step / k)
            if nf is None:
                continue
            gain = k * (nf - f[i])
            if gain > best_gain:
                best, best_gain, best_f = i, gain, nf
        if best < 0:
            return 0.0
        x[best] += step / curves[best][0]
        f[best] = best_f
    return sum(k * fv for (k, _), fv in zip(curves, f, strict=False)) / rate


def mix_of(phase: Phase) -> Mix:
    return phase.mix or Mix()
