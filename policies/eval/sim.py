"""Discrete-event simulation of a gateway in front of twin engines, on a virtual clock.

One `Engine` per backend steps on its own; each step's emissions land at the step's end time. A
closed-loop client population (the phase's concurrency) sends a new request as soon as one of
its requests finishes. The policy under test sees what the gateway would see: its own in-flight
counts, the backends' `/v1/loads`-style gauges polled every `poll_s`, and an `Outcome` per
finished request with the telemetry the relay extracts (tokens, TTFT, decode seconds, verify
count). No HTTP, no sleeping: a 10-minute scenario runs in about a second per policy.
"""

from __future__ import annotations

import heapq
import random
from typing import Callable

import msgspec

from backends import BackendSpec, Strategy
from backends.sim.engine import Engine, SimRequest
from backends.sim.profile import Profile, load_profile
from policies.base import BackendView, Domain, Outcome, Policy, RequestFeatures
from policies.eval.scenarios import Scenario

__all__ = ["RequestRecord", "RunResult", "build_engines", "simulate"]

_STEP, _POLL, _DEGRADE, _PHASE = 0, 1, 2, 3
MODEL = "eval-model"


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request as a client measures it (virtual seconds)."""

    rid: int
    backend: str
    domain: str
    t_send: float
    t_first: float = -1.0
    t_last: float = -1.0
    tokens: int = 0
    verify_ct: int = 0
    reason: str = ""
    client: int = 0

    @property
    def decode_tok_s(self) -> float | None:
        d = self.t_last - self.t_first
        return (self.tokens - 1) / d if self.tokens > 1 and d > 0 else None


class RunResult(msgspec.Struct, kw_only=True):
    """Everything a run produced, for the metrics module."""

    records: list[RequestRecord]  # finished requests, in completion order
    tokens_at: list[tuple[float, int]]  # (time, tokens emitted) per engine step end
    duration_s: float


class _Backend:
    __slots__ = ("name", "engine", "view", "busy", "integral", "t_change")

    def __init__(self, name: str, engine: Engine, view: BackendView) -> None:
        self.name = name
        self.engine = engine
        self.view = view
        self.busy = False
        self.integral = 0.0  # time integral of in-flight count: gives each request its mean load
        self.t_change = 0.0


def build_engines(scenario: Scenario, seed: int) -> dict[str, Engine]:
    """One engine per pool member, seeded apart so that backends draw different acceptances."""
    profiles: dict[str, Profile] = {name: load_profile(name) for name in scenario.pool}
    return {name: Engine(p, seed=seed * 7919 + i) for i, (name, p) in enumerate(profiles.items())}


def simulate(scenario: Scenario, make_policy: Callable[[dict[str, Engine], list[BackendSpec]], Policy],
             *, seed: int = 0, poll_s: float = 1.0) -> RunResult:
    """Run `scenario` under the policy `make_policy(engines, specs)` builds; deterministic in seed."""
    engines = build_engines(scenario, seed)
    specs = [BackendSpec(name=n, url=f"sim://{n}", model=MODEL, strategy=Strategy(e.profile.strategy))
             for n, e in engines.items()]
    policy = make_policy(engines, specs)
    backends = [_Backend(s.name, engines[s.name], BackendView(spec=s)) for s in specs]
    by_name = {b.name: b for b in backends}
    views = [b.view for b in backends]
    heap: list[tuple[float, int, int, object]] = []
    seq = 0

    def push(t: float, kind: int, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, payload))

    t_phase = 0.0
    for i, ph in enumerate(scenario.phases):
        push(t_phase, _PHASE, i)
        t_phase += ph.duration_s
    end = t_phase
    push(0.0, _POLL, None)
    if scenario.degrade is not None:
        push(scenario.degrade.at_s, _DEGRADE, scenario.degrade)

    now = 0.0
    target = 0
    phase = 0
    idle_clients: list[int] = []  # client ids without a request in flight, smallest first
    next_client = 0
    sent_by: dict[tuple[int, int], int] = {}  # (phase, client) -> requests sent
    domains: list[str] = ["chat"]
    weights: list[float] = [1.0]
    inflight: dict[str, tuple[RequestRecord, _Backend, int, float, SimRequest]] = {}
    finished: list[RequestRecord] = []
    tokens_at: list[tuple[float, int]] = []
    next_rid = 0

    def touch(b: _Backend) -> None:
        b.integral += b.view.inflight * (now - b.t_change)
        b.t_change = now

    def kick(b: _Backend) -> None:
        if b.busy or b.engine.idle:
            return
        res = b.engine.step()
        b.busy = True
        push(now + res.duration_s, _STEP, (b, res))

    def send(client: int) -> None:
        """Client `client` sends its next request. What it asks (domain, lengths, and the prompt
        text the engine seeds acceptance from) depends only on (phase, client, k-th request), so
        every contestant faces the same requests: common random numbers shrink the noise of
        per-phase ratios."""
        nonlocal next_rid
        rid = next_rid
        next_rid += 1
        k = sent_by.get((phase, client), 0)
        sent_by[(phase, client)] = k + 1
        tag = f"{seed}:{scenario.name}:{phase}:{client}:{k}"
        rng = random.Random(tag)
        dom = rng.choices(domains, weights)[0]
        max_tokens = rng.randint(scenario.min_tokens, scenario.max_tokens)
        prompt_tokens = rng.randint(50, 400)
        features = RequestFeatures(model=MODEL, domain=Domain(dom), prompt_tokens=prompt_tokens,
                                   max_tokens=max_tokens, stream=True)
        decision = policy.choose(features, views)
        b = by_name[decision.backend.spec.name]
        touch(b)
        b.view.inflight += 1
        sim_req = b.engine.submit(str(rid), prompt_tokens, max_tokens, tag, domain=dom)
        rec = RequestRecord(rid=rid, backend=b.name, domain=dom, t_send=now, reason=decision.reason,
                            client=client)
        inflight[str(rid)] = (rec, b, b.view.inflight, b.integral, sim_req)
        kick(b)

    while heap:
        t, _, kind, payload = heapq.heappop(heap)
        if t > end:
            break
        now = t
        if kind == _STEP:
            b, res = payload  # type: ignore[misc]
            b.busy = False
            total = 0
            for em in res.emissions:
                total += em.n_tokens
                entry = inflight.get(em.rid)
                if entry is None:
                    continue
                rec = entry[0]
                rec.tokens += em.n_tokens
                if rec.t_first < 0:
                    rec.t_first = now
                if em.finished:
                    del inflight[em.rid]
                    rec.t_last = now
                    touch(b)
                    mean_load = (b.integral - entry[3]) / (now - rec.t_send) if now > rec.t_send else None
                    b.view.inflight -= 1
                    verify_ct = entry[4].verify_ct or None  # SGLang reports it on speculative servers
                    rec.verify_ct = verify_ct or 0
                    policy.observe(Outcome(
                        backend=b.name, domain=Domain(rec.domain), inflight_at_dispatch=entry[2],
                        mean_inflight=mean_load, prompt_tokens=0, completion_tokens=rec.tokens,
                        ttft_s=rec.t_first - rec.t_send, decode_s=rec.t_last - rec.t_first,
                        verify_ct=verify_ct,
                        accept_length=rec.tokens / verify_ct if verify_ct else None,
                        finish_reason=em.finish_reason))
                    finished.append(rec)
                    if rec.client < target:
                        send(rec.client)
                    else:
                        heapq.heappush(idle_clients, rec.client)
            tokens_at.append((now, total))
            kick(b)
        elif kind == _PHASE:
            ph = scenario.phases[payload]  # type: ignore[index]
            domains = list(ph.domains)
            weights = [ph.domains[d] for d in domains]
            target = ph.concurrency
            phase = payload  # type: ignore[assignment]
            while next_client < target:
                heapq.heappush(idle_clients, next_client)
                next_client += 1
            while idle_clients and idle_clients[0] < target:
                send(heapq.heappop(idle_clients))
        elif kind == _POLL:
            for b in backends:
                st = b.engine.stats()
                v = b.view
                v.reported_running = st.num_running
                v.reported_waiting = st.num_waiting
                v.max_running = b.engine.max_running
                v.reported_accept_length = st.accept_length or None
                v.reported_inflight = v.inflight
            push(now + poll_s, _POLL, None)
        elif kind == _DEGRADE:
            deg = payload
            by_name[deg.backend].engine.accept_scale = deg.scale  # type: ignore[attr-defined]
    return RunResult(records=finished, tokens_at=tokens_at, duration_s=end)
