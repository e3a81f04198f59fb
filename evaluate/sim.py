"""Discrete-event simulation of a gateway in front of twin engines, on a virtual clock.

One `Engine` per backend steps on its own; each step's emissions land at the step's end time.
Traffic comes as sessions (`evaluate.workload`): closed-loop clients run one session after
another (a new one as soon as theirs ends), open-loop sessions arrive by a Poisson or bursty
process (`evaluate.arrivals`) whatever the fleet is doing. A session's next turn is sent
after the previous one finished plus its think (or tool) time.

The policy under test sees what the gateway would see:
- `RequestFeatures` as the gateway builds them: domain, prompt tokens, max_tokens, temperature,
  thinking, tools, the prompt's block chain as the prefix, and for a turn that asks an earlier
  answer back (`Turn.copy_of`) the key of the turn that answered it (`policies.copy`);
- its own in-flight counts, and the backends' `/v1/loads` and `/metrics` gauges polled every
  `poll_s` (running, waiting, the windowed accept length; the gateway runs servers with
  `--enable-metrics`);
- an `Outcome` per finished request with the telemetry the relay extracts: tokens, TTFT, decode
  seconds, verify count, cached tokens (`--enable-cache-report`), reasoning tokens.

NGRAM servers draft from a trie of what they generated (docs/twin.md, "NGRAM"): each finished turn
leaves its answer's fingerprints (stand-ins keyed by the turn, one per `ngram.BLOCK_WORDS` tokens)
in the memory of the server that generated it, and a turn that returns an earlier answer gets
the echo share (`ngram.echo_share`) of what that server still remembers of it, as the HTTP twin
computes it from the text. Another server, or text from the prompt (`Turn.copy`: a file a tool
read), finds nothing.
A policy with an `update_loads(snapshots)` method (the SGLang router's, `evaluate.peers`)
gets its own load poll every `policy.poll_s`, as that router polls on its own schedule.

Overload: a server with `max_queued` waiting requests answers 503 (SGLang's
`--max-queued-requests`); the harness retries once on another backend, as the gateway does with
a 503 before any byte reached the client, and then counts the request shed. A shed turn ends its
session. Open-loop scenarios run past the last phase until what is in flight has finished (at
most `DRAIN_S`), so the last phase's requests are measured too; what is still unfinished then is
recorded as such. No HTTP, no sleeping: minutes of traffic run in seconds.

Open-loop phases are independent samples of steady traffic (a day's stretch of hours is simulated
for minutes): at a phase's end arrivals stop, sessions send no further turns, and what is in
flight finishes (at most `DRAIN_S`; the rest is aborted and recorded unfinished) before the next
phase starts. A backlog built in a simulated minute of peak would otherwise weigh on hours of the
next stretch. The policy, the servers' caches and the clock carry over, as in one long run.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

import msgspec

from backends import BackendSpec, Strategy
from evaluate.arrivals import Arrivals
from evaluate.fleet import Server, parse_fleet, servers
from evaluate.peers import LoadSnapshot
from evaluate.scenarios import Phase, Scenario
from evaluate.sources import TraceSource
from evaluate.workload import Mix, Session, Turn, draw_session, single_request
from policies.base import BackendView, Domain, NoCandidate, Outcome, Policy, RequestFeatures, Resident
from policies.prefill import causal_pairs
from twin.domain import prompt_key
from twin.engine import Engine, QueueFull, SimRequest
from twin.ngram import BLOCK_WORDS, echo_share
from twin.thinking import ReasoningModel

__all__ = ["DRAIN_S", "MODEL", "RequestRecord", "RunResult", "build_engines", "fleet_servers", "simulate"]

_STEP, _POLL, _PEER_POLL, _DEGRADE, _PHASE, _ARRIVAL, _TURN, _PHASE_END, _DRAIN_DEADLINE = range(9)
MODEL = "eval-model"
DRAIN_S = 300.0


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
    phase: int = 0  # the phase the request was sent in
    status: str = "ok"  # ok | shed (503 twice) | unfinished (still running when the run ended)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    session: str = ""
    kind: str = "single"
    turn: int = 0
    temperature: float = 0.0
    retried: bool = False
    copy: bool = False  # the turn returns an earlier answer of its session (`Turn.copy_of`)

    @property
    def decode_tok_s(self) -> float | None:
        d = self.t_last - self.t_first
        return (self.tokens - 1) / d if self.tokens > 1 and d > 0 else None

    @property
    def ttft_s(self) -> float | None:
        return self.t_first - self.t_send if self.t_first >= 0 else None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (TPOT / mean ITL): (last - first) / (n - 1)."""
        d = self.t_last - self.t_first
        return d / (self.tokens - 1) if self.tokens > 1 and self.status == "ok" else None

    @property
    def e2e_s(self) -> float | None:
        return self.t_last - self.t_send if self.status == "ok" and self.t_last >= 0 else None


class RunResult(msgspec.Struct, kw_only=True):
    """Everything a run produced, for the metrics module."""

    records: list[RequestRecord]  # finished requests, in completion order
    tokens_at: list[tuple[float, int]]  # (time, tokens emitted) per engine step end
    duration_s: float
    failed: list[RequestRecord] = []  # shed and unfinished requests
    phase_rates: list[float] = []  # open-loop request rate per phase (0 for closed loop)
    phase_starts: list[float] = []  # when each phase began (open loop: after the previous one drained)


class _Backend:
    __slots__ = ("name", "engine", "view", "busy", "integral", "t_change", "waiting_tokens", "prefilling")

    def __init__(self, name: str, engine: Engine, view: BackendView) -> None:
        self.name = name
        self.engine = engine
        self.view = view
        self.busy = False
        self.integral = 0.0  # time integral of in-flight count: gives each request its mean load
        self.t_change = 0.0
        self.waiting_tokens: dict[str, int] = {}  # rid -> prompt tokens, until its first token
        # rid -> the tokens the decision expected to be prefilled and their causal pairs, until its
        # first token (the gateway's BackendView.pending_prefill and pending_pairs are their sums)
        self.prefilling: dict[str, tuple[int, float]] = {}

    def prefill_started(self, rid: str, tokens: int, prompt_tokens: int) -> None:
        pairs = causal_pairs(prompt_tokens, tokens)
        self.prefilling[rid] = (tokens, pairs)
        self.view.prefill_queued(tokens, pairs)

    def prefill_done(self, rid: str) -> None:
        if rid not in self.prefilling:
            return
        self.view.prefill_finished(*self.prefilling.pop(rid))


class _Flight(msgspec.Struct, kw_only=True):
    rec: RequestRecord
    features: RequestFeatures
    backend: _Backend
    inflight_at_dispatch: int
    integral_at_dispatch: float
    sim: SimRequest
    turn: Turn
    stream: _Stream
    resident: Resident
    progress: _Progress


class _Progress:
    """A request's stream as a gateway would read it (`policies.base.StreamProgress`): one chunk
    per engine step that gave it tokens."""

    __slots__ = ("t_first", "t_last", "generated")

    def __init__(self) -> None:
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.generated = 0

    def chunk(self, now: float) -> None:
        if self.t_first is None:
            self.t_first = now
        self.t_last = now
        self.generated += 1


class _Stream:
    """A session in progress: which turn is next, and who runs it (closed-loop client or None)."""

    __slots__ = ("session", "next_turn", "client", "phase")

    def __init__(self, session: Session, client: int | None, phase: int) -> None:
        self.session = session
        self.next_turn = 0
        self.client = client
        self.phase = phase


def fleet_servers(scenario: Scenario) -> list[Server]:
    """The scenario's pool as named servers (a plain profile name is a one-server member)."""
    return servers(parse_fleet(",".join(scenario.pool)))


def build_engines(scenario: Scenario, seed: int) -> dict[str, Engine]:
    """One engine per server, seeded apart so that backends draw different acceptances; a
    member's acceptance scale is the engine's `accept_scale`."""
    out = {}
    for i, s in enumerate(fleet_servers(scenario)):
        e = Engine(s.member.build_profile(), seed=seed * 7919 + i, max_queued=scenario.max_queued)
        e.accept_scale = s.member.accept_scale
        out[s.name] = e
    return out


def _reasoning_model(engines: dict[str, Engine]) -> ReasoningModel | None:
    """The model's reasoning-length table (all servers of a fleet serve one model)."""
    for e in engines.values():
        if e.profile.reasoning is not None:
            return e.profile.reasoning
    return None


def _phase_rate(scenario: Scenario, ph: Phase, n_servers: int) -> float:
    from evaluate.capacity import reference_rate  # capacity simulates with this module

    if isinstance(ph.source, TraceSource):
        return ph.source.rate  # the trace's own arrivals
    return ph.load * reference_rate(scenario, ph, n_servers)


def simulate(
    scenario: Scenario,
    make_policy: Callable[[dict[str, Engine], list[BackendSpec]], Policy],
    *,
    seed: int = 0,
    poll_s: float = 1.0,
    phase_rates: list[float] | None = None,
    ignore_delays: bool = False,
    share: tuple[int, int] | None = None,
    first_phase: int = 0,
) -> RunResult:
    """Run `scenario` under the policy `make_policy(engines, specs)` builds; deterministic in seed.

    `phase_rates` (requests/s per phase) overrides the open-loop rates computed from the
    scenario's reference capacity; `ignore_delays` sends a session's next turn at once (the
    capacity measurement: work per request, not user pacing). `share = (k, n)` starts only the
    open-loop sessions whose arrival index is k modulo n, at the times they arrive in the full
    run: n runs with k = 0 .. n-1 serve the full run's sessions between them, each once.
    `first_phase = i`: the scenario's phases are those from index i on of a longer run and draw
    that run's random streams (arrivals, sessions; `Scenario.stream_key`), so a phase simulated
    alone gets the requests it got there."""
    if share is not None and not 0 <= share[0] < share[1]:
        raise ValueError(f"share (k, n) needs 0 <= k < n, got {share}")
    engines = build_engines(scenario, seed)
    specs = [
        BackendSpec(name=n, url=f"sim://{n}", model=MODEL, strategy=Strategy(e.profile.strategy))
        for n, e in engines.items()
    ]
    policy = make_policy(engines, specs)
    backends = [
        _Backend(s.name, engines[s.name], BackendView(spec=s, kv_tokens=engines[s.name].profile.max_total_num_tokens))
        for s in specs
    ]
    by_name = {b.name: b for b in backends}
    views = [b.view for b in backends]
    reasoning = _reasoning_model(engines)
    rates = (
        list(phase_rates)
        if phase_rates is not None
        else [_phase_rate(scenario, ph, len(backends)) if ph.open_loop else 0.0 for ph in scenario.phases]
    )
    answer = (scenario.min_tokens, scenario.max_tokens)
    stream_keys = [scenario.stream_key(i, first_phase) for i in range(len(scenario.phases))]
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, payload))

    independent = scenario.open_loop
    starts: list[float] = []
    if independent:
        push(0.0, _PHASE, 0)
        end = math.inf  # known when the last phase has drained
    else:
        t_phase = 0.0
        for i, ph in enumerate(scenario.phases):
            starts.append(t_phase)
            push(t_phase, _PHASE, i)
            t_phase += ph.duration_s
        end = t_phase
    accepting = True  # open loop: False while a phase drains
    draining = False
    push(0.0, _POLL, None)
    peer_poll = getattr(policy, "update_loads", None)
    choose_turn = getattr(policy, "choose_turn", None)  # the clairvoyant reads the turn itself
    bind = getattr(policy, "bind_inflight", None)
    if bind is not None:  # ... and the requests in flight, with their true progress
        bind(lambda name: (f.sim for f in inflight.values() if f.backend.name == name))
    if peer_poll is not None:
        push(0.0, _PEER_POLL, None)
    if scenario.degrade is not None:
        push(scenario.degrade.at_s, _DEGRADE, scenario.degrade)

    now = 0.0
    target = 0
    phase = 0
    idle_clients: list[int] = []  # client ids without a session, smallest first
    next_client = 0
    started_by: dict[tuple[int, int], int] = {}  # (phase, client) -> sessions started
    arrivals: Arrivals | None = None
    replaying = False  # the current phase's arrivals are a trace's (all scheduled at its start)
    arrived = 0  # sessions arrived in the current open-loop phase
    drawn = 0  # sessions drawn from the current phase's source by closed-loop clients
    domains: list[str] = ["chat"]
    weights: list[float] = [1.0]
    inflight: dict[str, _Flight] = {}
    finished: list[RequestRecord] = []
    failed: list[RequestRecord] = []
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

    def new_session(client: int | None) -> Session:
        nonlocal drawn
        ph = scenario.phases[phase]
        if client is not None:
            k = started_by.get((phase, client), 0)
            started_by[(phase, client)] = k + 1
            tag = f"{seed}:{stream_keys[phase]}:{client}:{k}"
        else:
            tag = f"{seed}:{stream_keys[phase]}:open:{arrived}"
        if ph.source is not None:  # an open-loop arrival takes its own index; clients take them in turn
            index = arrived if client is None else drawn
            drawn += client is not None
            return ph.source.session(tag, index, seed)
        if ph.mix is None:  # a closed loop's single greedy prompt, drawn as it always was
            rng = random.Random(tag)
            dom = rng.choices(domains, weights)[0]
            max_tokens = rng.randint(*answer)
            return single_request(tag, dom, rng.randint(*scenario.prompt_tokens), max_tokens)
        return draw_session(tag, ph.mix, domains, weights, answer, reasoning)

    def start(client: int | None) -> None:
        stream = _Stream(new_session(client), client, phase)
        send(stream)

    def end_stream(stream: _Stream) -> None:
        c = stream.client
        if c is None or now >= end or not accepting:
            return
        if c < target and not scenario.phases[phase].open_loop:
            start(c)
        else:
            heapq.heappush(idle_clients, c)

    def dispatch(
        features: RequestFeatures, turn: Turn, rid: int, exclude: str | None
    ) -> tuple[_Backend, SimRequest | None, str, int, float] | None:
        pool = views if exclude is None else [v for v in views if v.spec.name != exclude]
        if not pool:
            return None
        try:
            decision = policy.choose(features, pool) if choose_turn is None else choose_turn(features, pool, turn)
        except NoCandidate:
            return None
        b = by_name[decision.backend.spec.name]
        try:
            sim_req = b.engine.submit(
                str(rid),
                turn.prompt_tokens,
                turn.max_tokens,
                turn.tag,
                domain=turn.domain,
                temperature=turn.temperature,
                prefix_blocks=turn.chain,
                key=prompt_key(turn.tag),
                echo=_echo(b.engine, turn),
            )
        except QueueFull:
            # the 503 reaches the gateway at once: the policy hears of the failed attempt
            policy.observe(
                Outcome(
                    backend=b.name,
                    domain=Domain(turn.domain),
                    inflight_at_dispatch=b.view.inflight + 1,
                    prompt_tokens=turn.prompt_tokens,
                    error="queue_full",
                    features=features,
                )
            )
            return b, None, decision.reason, 0, 0.0  # None: the backend answered 503 (queue full)
        pf = decision.prefill_tokens
        return b, sim_req, decision.reason, turn.prompt_tokens if pf is None else pf, decision.expected_tokens

    def send(stream: _Stream) -> None:
        """The stream's next turn goes out now."""
        nonlocal next_rid
        turn = stream.session.turns[stream.next_turn]
        stream.next_turn += 1
        rid = next_rid
        next_rid += 1
        # A client of a thinking, agentic model does not know how long the answer will be: it sends
        # no max_tokens (SGLang's default cap), so the policy predicts the length from what it has
        # seen; the closed loops' single requests keep their exact max_tokens (loadgen's ignore_eos runs).
        features = RequestFeatures(
            model=MODEL,
            domain=Domain(turn.domain),
            prompt_tokens=turn.prompt_tokens,
            max_tokens=turn.max_tokens if stream.session.exact_length else None,
            stream=True,
            temperature=turn.temperature,
            thinking=turn.thinking,
            tools=turn.tools,
            prefix=turn.chain,
            prompt_key=prompt_key(turn.tag),
            copy_of=prompt_key(turn.copy_of) if turn.copy_of else 0,
        )
        rec = RequestRecord(
            rid=rid,
            backend="",
            domain=turn.domain,
            t_send=now,
            client=stream.client or 0,
            phase=phase,
            prompt_tokens=turn.prompt_tokens,
            reasoning_tokens=turn.reasoning_tokens,
            session=stream.session.tag,
            kind=stream.session.kind,
            turn=stream.next_turn - 1,
            temperature=turn.temperature,
            copy=bool(turn.copy_of),
        )
        got = dispatch(features, turn, rid, None)
        if got is not None and got[1] is None:  # 503: once more on another backend
            rec.retried = True
            got = dispatch(features, turn, rid, got[0].name)
        if got is None or got[1] is None:
            rec.status = "shed"
            rec.backend = got[0].name if got is not None else ""
            failed.append(rec)
            end_stream(stream)
            return
        b, sim_req, reason, prefill, expected = got
        assert sim_req is not None  # checked above (a tuple item's check does not narrow the unpacking)
        rec.backend = b.name
        rec.reason = reason
        touch(b)
        b.view.inflight += 1
        b.waiting_tokens[str(rid)] = turn.prompt_tokens
        b.prefill_started(str(rid), prefill, features.prompt_tokens)
        progress = _Progress()
        resident = Resident(progress, expected, features.max_tokens)  # as the gateway's Attempt
        b.view.residents.add(resident)
        inflight[str(rid)] = _Flight(
            rec=rec,
            features=features,
            backend=b,
            inflight_at_dispatch=b.view.inflight,
            integral_at_dispatch=b.integral,
            sim=sim_req,
            turn=turn,
            stream=stream,
            resident=resident,
            progress=progress,
        )
        kick(b)

    def complete(f: _Flight) -> None:
        rec, b = f.rec, f.backend
        touch(b)
        mean_load = (b.integral - f.integral_at_dispatch) / (now - rec.t_send) if now > rec.t_send else None
        b.view.inflight -= 1
        b.view.residents.discard(f.resident)
        verify_ct = f.sim.verify_ct or None  # SGLang reports it on speculative servers
        rec.verify_ct = verify_ct or 0
        rec.cached_tokens = f.sim.cached_tokens
        b.engine.cache_output(f.turn.output_chain)
        if b.engine.ngram_memory is not None:
            b.engine.remember_output(_answer_blocks(f.turn.tag, f.turn.answer_tokens))
        policy.observe(
            Outcome(
                backend=b.name,
                domain=Domain(rec.domain),
                inflight_at_dispatch=f.inflight_at_dispatch,
                mean_inflight=mean_load,
                prompt_tokens=rec.prompt_tokens,
                completion_tokens=rec.tokens,
                ttft_s=rec.t_first - rec.t_send,
                decode_s=rec.t_last - rec.t_first,
                verify_ct=verify_ct,
                accept_length=rec.tokens / verify_ct if verify_ct else None,
                finish_reason="tool_calls" if f.turn.tool_call else "stop",
                cached_tokens=rec.cached_tokens,
                reasoning_tokens=rec.reasoning_tokens or None,
                features=f.features,
            )
        )
        finished.append(rec)
        stream = f.stream
        if stream.next_turn < len(stream.session.turns) and now < end and accepting:
            delay = 0.0 if ignore_delays else stream.session.turns[stream.next_turn].delay_s
            push(now + delay, _TURN, stream)
        else:
            end_stream(stream)

    def next_phase() -> None:
        """Open loop: the drained phase is over; the next one starts now (or the run ends)."""
        nonlocal draining, accepting, end
        draining = False
        for f in list(inflight.values()):  # past the drain deadline: aborted, counted unfinished
            f.backend.engine.abort(str(f.rec.rid))
            f.backend.prefill_done(str(f.rec.rid))
            f.backend.waiting_tokens.pop(str(f.rec.rid), None)
            touch(f.backend)
            f.backend.view.inflight -= 1
            f.backend.view.residents.discard(f.resident)
            f.rec.status = "unfinished"
            failed.append(f.rec)
        inflight.clear()
        if phase + 1 < len(scenario.phases):
            push(now, _PHASE, phase + 1)
        else:
            end = now

    while heap:
        t, _, kind, payload = heapq.heappop(heap)
        if t > end:
            break
        now = t
        if kind == _STEP:
            b, res = payload
            b.busy = False
            total = 0
            for em in res.emissions:
                total += em.n_tokens
                f = inflight.get(em.rid)
                if f is None:
                    continue
                rec = f.rec
                rec.tokens += em.n_tokens
                f.progress.chunk(now)
                if rec.t_first < 0:
                    rec.t_first = now
                    b.waiting_tokens.pop(em.rid, None)
                    b.prefill_done(em.rid)
                if em.finished:
                    del inflight[em.rid]
                    rec.t_last = now
                    complete(f)
            tokens_at.append((now, total))
            kick(b)
            if draining and not inflight:
                next_phase()
        elif kind == _TURN:
            if now < end and accepting:
                send(payload)
        elif kind == _ARRIVAL:
            ph_index, when = payload
            if ph_index == phase and replaying and accepting:
                if share is None or arrived % share[1] == share[0]:
                    start(None)
                arrived += 1
            elif ph_index == phase and arrivals is not None and accepting:
                if share is None or arrived % share[1] == share[0]:
                    start(None)
                arrived += 1
                nxt = arrivals.next_after(when)
                if nxt < starts[phase] + scenario.phases[phase].duration_s:
                    push(nxt, _ARRIVAL, (phase, nxt))
        elif kind == _PHASE_END:
            accepting = False
            arrivals = None
            if inflight:
                draining = True
                push(now + DRAIN_S, _DRAIN_DEADLINE, payload)
            else:
                next_phase()
        elif kind == _DRAIN_DEADLINE:
            if draining and payload == phase:
                next_phase()
        elif kind == _PHASE:
            ph = scenario.phases[payload]
            domains = list(ph.domains)
            weights = [ph.domains[d] for d in domains]
            phase = payload
            arrived = drawn = 0
            arrivals = None
            replaying = ph.arrival == "trace" and isinstance(ph.source, TraceSource)
            if replaying:  # before the phase's end, so that an arrival at its last instant still counts
                assert isinstance(ph.source, TraceSource)
                for offset in ph.source.arrival_times():
                    push(now + offset, _ARRIVAL, (phase, now + offset))
            if independent:
                starts.append(now)
                accepting = True
                push(now + ph.duration_s, _PHASE_END, phase)
            if replaying:
                target = 0
            elif ph.open_loop:
                target = 0
                mean_turns = ph.source.mean_turns if ph.source is not None else (ph.mix or Mix()).mean_turns
                session_rate = rates[phase] / mean_turns
                arrivals = Arrivals(
                    ph.arrival,
                    session_rate,
                    now,
                    random.Random(f"{seed}:{stream_keys[phase]}:arrivals"),
                    ph.burst,
                )
                first = arrivals.next_after(now)
                if first < now + ph.duration_s:
                    push(first, _ARRIVAL, (phase, first))
            else:
                target = ph.concurrency
                while next_client < target:
                    heapq.heappush(idle_clients, next_client)
                    next_client += 1
                while idle_clients and idle_clients[0] < target:
                    start(heapq.heappop(idle_clients))
        elif kind == _POLL:
            for b in backends:
                st = b.engine.stats()
                v = b.view
                v.reported_running = st.num_running
                v.reported_waiting = st.num_waiting
                v.max_running = b.engine.max_running
                v.reported_accept_length = st.accept_length or None
                v.reported_inflight = v.inflight
                v.decode_moments = st.decode_moments
                v.prefill_counters = (float(st.total_prefill_busy_us), float(st.total_prompt_tokens))
                v.note_prefill_report()
            push(now + poll_s, _POLL, None)
        elif kind == _PEER_POLL:
            snaps = {}
            for b in backends:
                st = b.engine.stats()
                snaps[b.name] = LoadSnapshot(
                    num_used_tokens=st.num_used_tokens,
                    token_usage=st.token_usage,
                    gen_throughput=st.gen_throughput,
                    num_waiting_uncached_tokens=sum(b.waiting_tokens.values()),
                )
            assert peer_poll is not None
            peer_poll(snaps)
            push(now + getattr(policy, "poll_s", 10.0), _PEER_POLL, None)
        elif kind == _DEGRADE:
            deg = payload
            e = by_name[deg.backend].engine
            e.accept_scale = e.accept_scale * deg.scale
    for f in inflight.values():
        f.rec.status = "unfinished"
        failed.append(f.rec)
    return RunResult(
        records=finished,
        tokens_at=tokens_at,
        duration_s=end if math.isfinite(end) else now,
        failed=failed,
        phase_rates=[r if math.isfinite(r) else 0.0 for r in rates],
        phase_starts=starts,
    )


def _answer_blocks(tag: str, answer_tokens: int) -> list[int]:
    """Stand-ins for the fingerprints (`twin.ngram.fingerprints`) of turn `tag`'s answer: one per
    BLOCK_WORDS tokens, as many as the HTTP twin keeps of an answer that long (within a factor of a
    word's tokens, which a share does not see)."""
    return [prompt_key(f"{tag}:answer:{j}") for j in range(max(1, answer_tokens // BLOCK_WORDS))]


def _echo(engine: Engine, turn: Turn) -> float:
    """The echo share of a turn that returns an earlier answer on this engine (0.0 elsewhere)."""
    memory = engine.ngram_memory
    if memory is None or not turn.copy_of:
        return 0.0
    recalled = memory.recall(_answer_blocks(turn.copy_of, turn.copy_tokens))
    return echo_share(recalled, turn.answer_tokens, turn.max_tokens)
