"""Load shapes: closed loop (exactly C requests in flight), open loop (Poisson arrivals) and
trace replay (arrivals when a recorded trace had them).

Closed loop runs C workers that each keep one request outstanding, so the in-flight count can
never exceed C and stays at C until the prompts (or the duration) run out. Open loop draws
exponential inter-arrival times at rate R (seeded) and, when capped by C, makes arrivals wait
for a free slot (like bench_serving's --max-concurrency); latency counts from the actual send.
Warmup requests run first at the level's own concurrency and are drained and discarded, so the
measured level starts with warm connections and the same cold queue as a "batch" of the studies.

With a session dataset the unit of concurrency is the conversation: a closed-loop worker (an
open-loop arrival) takes one session and sends its turns one after the other, each with the
history of the answers the server actually gave, so C workers keep at most C requests in flight
and every turn after the first finds its prefix on the server that served the last one, if the
server kept it. `num_prompts` counts sessions; records carry `session` and `turn`.

A trace (`Dataset.trace`, `loadgen.trace_dataset`) is open loop with the trace's own arrival
times: request i is built just before it falls due (`due_s(i)` x the level's `time_scale`
seconds after the level starts) and sent then, whatever the server is doing; `concurrency`, when
set, caps what is in flight (arrivals wait for a slot, and count as late). Each record carries
when it was due (`scheduled_s`): the level reports how late the sends were.

With `RequestOptions.chain_responses` (`--endpoint responses`) the history stays on the server
instead: every turn is stored (`store: true`), and each turn after the first sends only its new
user message with `previous_response_id` = the previous turn's response id; records carry both ids.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import aiohttp
import msgspec

from loadgen.agentic import AGENTIC_DOMAIN
from loadgen.agentic_replay import AgenticReplay
from loadgen.client import RequestOptions, Target, build_body, send, settings
from loadgen.conversations import assistant_message, session_messages
from loadgen.datasets import Dataset, Message, Prompt, Session
from loadgen.metrics import Gap, summarize
from loadgen.summary import Level, RequestRecord
from loadgen.trace_dataset import TraceReplay

OnRecord = Callable[[RequestRecord], None]


class LevelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One load level. `concurrency` None = uncapped (open loop only); `request_rate` None =
    closed loop; `duration` set = issue requests until it elapses instead of `num_prompts`."""

    concurrency: int | None
    request_rate: float | None = None
    num_prompts: int = 0
    duration: float | None = None
    warmup: int = 0
    time_scale: float = 1.0  # wall seconds per trace second (targets that run faster than real time)

    @property
    def mode(self) -> str:
        return "closed" if self.request_rate is None else "open"


class LevelResult(msgspec.Struct):
    level: Level
    records: list[RequestRecord]


def arrival_offsets(rate: float, rng: random.Random) -> Iterator[float]:
    """Poisson process: send times in seconds after the level start (0.0 first); all 0.0 for an
    infinite rate (everything at once, like bench_serving's rate inf)."""
    t = 0.0
    while True:
        yield t
        if not math.isinf(rate):
            t += rng.expovariate(rate)


async def sleep_until(due: float) -> None:
    """Return no earlier than `due` on the perf_counter clock. uvloop's timers tick in
    milliseconds and can wake up to a tick early, so it sleeps again, at least one tick, rather
    than spin on zero-length timers."""
    wait = due - time.perf_counter()
    while wait > 0:
        await asyncio.sleep(wait)
        wait = due - time.perf_counter()
        if wait > 0:
            wait = max(wait, 1e-3)


class LoopRef(msgspec.Struct, frozen=True):
    """An agent loop of the agentic dataset, drawn when a worker (an arrival) starts it."""

    index: int


Work = Prompt | Session | LoopRef  # what one closed-loop worker or one open-loop arrival takes


def _work(dataset: Dataset, spec: LevelSpec) -> Iterator[tuple[int, Work]]:
    if dataset.agentic is not None:
        loops = itertools.count() if spec.duration is not None else range(spec.num_prompts)
        return ((i, LoopRef(i)) for i in loops)
    items: Sequence[Work] = dataset.sessions if dataset.is_sessions else dataset.prompts
    if spec.duration is not None:
        return enumerate(itertools.cycle(items))
    if dataset.is_sessions:
        return enumerate(dataset.take_sessions(spec.num_prompts))
    return enumerate(dataset.take(spec.num_prompts))


class _Level:
    """What every request of one level shares, and where its results go."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        target: Target,
        opts: RequestOptions,
        spec: LevelSpec,
        *,
        deadline: float | None = None,
        on_record: OnRecord | None = None,
        seed: int = 0,
    ) -> None:
        self.http, self.target, self.opts, self.spec = http, target, opts, spec
        self.seed = seed
        self.deadline = deadline
        self.on_record = on_record
        self.t0 = time.perf_counter()
        self.records: list[RequestRecord] = []
        self.gaps: list[Gap] = []
        self._turn_index = itertools.count()
        self.agentic: AgenticReplay | None = None

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def record(self, index: int, domain: str, waited_s: float | None = None) -> RequestRecord:
        """`waited_s`: how long its arrival waited for a free slot (open loop with a cap)."""
        return RequestRecord(
            index=index,
            target=self.target.label,
            max_concurrency=self.spec.concurrency,
            request_rate=self.spec.request_rate,
            domain=domain,
            start_s=time.perf_counter() - self.t0,
            ok=False,
            client_wait_ms=None if waited_s is None else waited_s * 1000,
        )

    def done(self, rec: RequestRecord, gaps: list[Gap]) -> None:
        self.gaps.extend(gaps)
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    async def run(
        self,
        i: int,
        work: Work,
        waited_s: float | None = None,
        due: tuple[float, int] | None = None,
        body: bytes | None = None,
    ) -> None:
        """`waited_s`: how long its arrival waited for a free slot (open loop with a cap); `due`:
        a trace request's due time (seconds after the level start) and line in the trace; `body`:
        its request body, built ahead."""
        if isinstance(work, Session):
            await self._session(i, work, waited_s)
            return
        if isinstance(work, LoopRef):
            await self._agent(work.index, waited_s)
            return
        rec = self.record(i, work.domain, waited_s)
        if due is not None:
            rec.scheduled_s, rec.trace_line = due
        sent = await send(self.http, self.target, work, self.opts, rec, index=i, body=body)
        self.done(rec, sent.gaps)

    async def _session(self, i: int, s: Session, waited_s: float | None = None) -> None:
        """The turns of one conversation in order, each with the answers the server gave so far.
        A failed turn ends its session (later turns would carry a history that never happened);
        after the level's deadline no new turn starts."""
        history: list[Message] = []
        chain = self.opts.chain_responses
        previous: str | None = None  # chain: the last turn's response id
        think = self.opts.think_time_s
        pauses = random.Random(f"{self.seed}:think:{i}") if think else None
        for turn in range(len(s.turns)):
            if turn and pauses is not None:
                await asyncio.sleep(pauses.expovariate(1 / think))
            if turn and self.expired():
                return
            prompt = Prompt(
                messages=(Message("user", s.turns[turn]),) if previous else session_messages(s, history, turn),
                domain=s.domain,
                max_tokens=s.max_tokens,
                thinking=s.thinking,
                temperature=s.temperature,
                top_p=s.top_p,
                priority=s.priority,
            )
            # the session's arrival waited, its first turn; later turns follow their answers
            rec = self.record(next(self._turn_index), s.domain, waited_s if turn == 0 else None)
            rec.session, rec.turn = i, turn
            if chain:
                rec.previous_response_id = previous
            sent = await send(
                self.http,
                self.target,
                prompt,
                self.opts,
                rec,
                index=i,
                keep_answer=True,
                store=chain,
                previous_response_id=previous,
            )
            if chain and sent.answer is not None:
                previous = rec.response_id = sent.answer.response_id
                if previous is None:  # nothing to chain the next turn to
                    rec.ok, rec.error, rec.error_detail = False, "bad_response", "response has no id to chain from"
                    sent.gaps.clear()
            self.done(rec, sent.gaps)
            if not rec.ok or sent.answer is None:
                return
            if not chain:
                answer = assistant_message(sent.answer.content, sent.answer.tool_calls)
                history += [Message("user", s.turns[turn]), answer]

    async def _agent(self, i: int, waited_s: float | None) -> None:
        """Agent loop i: its calls in order, each with the context so far and the answers the server
        gave (`loadgen.agentic_replay`); a failed call ends the loop, and after the level's deadline
        no new call starts."""
        replay = self.agentic
        assert replay is not None
        loop = replay.loop(i)
        messages = replay.opening(loop)
        for k, call in enumerate(loop.calls):
            if k:
                await asyncio.sleep(call.delay_s * self.spec.time_scale)
                if self.expired():
                    return
            prompt = replay.prompt(i, loop, k, messages)
            rec = self.record(next(self._turn_index), AGENTIC_DOMAIN, waited_s if k == 0 else None)
            rec.session, rec.turn = i, k
            sent = await send(self.http, self.target, prompt, self.opts, rec, index=i, keep_answer=True)
            self.done(rec, sent.gaps)
            if not rec.ok or sent.answer is None:
                return
            if k + 1 < len(loop.calls):
                calls = sent.answer.tool_calls
                ids = [str(c.get("id")) for c in calls if c.get("id")]
                answer = assistant_message(sent.answer.content, calls)
                extra = tuple(Message("tool", "done", tool_call_id=x) for x in ids[1:])  # parallel calls
                messages = (*messages, answer, replay.follow_up(loop, k + 1, ids[0] if ids else None), *extra)


async def run_level(
    session: aiohttp.ClientSession,
    target: Target,
    dataset: Dataset,
    spec: LevelSpec,
    opts: RequestOptions,
    *,
    seed: int = 0,
    on_record: OnRecord | None = None,
    goodput_slos_ms: Mapping[str, float] | None = None,
) -> LevelResult:
    """Run warmup then the measured level; every issued request ends up in the records.
    `goodput_slos_ms`: SLOs on the wall clock, for the level's SLO goodput."""
    if spec.warmup > 0:
        width = spec.concurrency or spec.warmup
        size = len(dataset.sessions or dataset.prompts)
        warm = dataset.take(spec.warmup, offset=size // 2)
        await _closed(_Level(session, target, opts, spec), iter(enumerate(warm)), width)
    deadline = time.perf_counter() + spec.duration if spec.duration is not None else None
    lv = _Level(session, target, opts, spec, deadline=deadline, on_record=on_record, seed=seed)
    lv.agentic = dataset.agentic
    mode, rate = spec.mode, spec.request_rate
    if dataset.trace is not None:
        await _replay(lv, dataset.trace)
        mode, rate = "trace", offered_rate(dataset.trace, spec)
    elif spec.request_rate is None:
        await _closed(lv, _work(dataset, spec), spec.concurrency or 1)
    else:
        await _open(lv, _work(dataset, spec), random.Random(seed))
    duration = time.perf_counter() - lv.t0
    records = sorted(lv.records, key=lambda r: r.index)
    level = summarize(
        records,
        lv.gaps,
        duration=duration,
        max_concurrency=spec.concurrency,
        request_rate=rate,
        mode=mode,
        goodput_slos_ms=goodput_slos_ms,
    )
    return LevelResult(level, records)


def offered_rate(replay: TraceReplay, spec: LevelSpec) -> float | None:
    """Requests per wall second the trace's window offers at its speed-up (and time scale)."""
    wall = replay.trace.replay_s * spec.time_scale
    return min(len(replay), spec.num_prompts or len(replay)) / wall if wall > 0 else None


LOOKAHEAD_S = 0.05  # a trace's requests are built this long before they fall due (wall seconds) ...
MAX_AHEAD = 64  # ... at most this many at once (their bodies wait in memory)


async def _replay(lv: _Level, replay: TraceReplay) -> None:
    """Send the trace's requests at their due times (the module docstring). Each request's prompt
    and body are built ahead of its due time, so a burst of arrivals (the Mooncake trace has many
    requests on the same millisecond) goes out at the cost of sending alone; the level's clock
    starts once the first of them are ready."""
    spec = lv.spec
    slots = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    count = min(len(replay), spec.num_prompts or len(replay))
    ahead: collections.deque[tuple[int, Prompt, bytes]] = collections.deque()
    nxt = 0

    def offset(i: int) -> float:
        return replay.due_s(i) * spec.time_scale

    def fill(horizon: float) -> None:
        nonlocal nxt
        while nxt < count and len(ahead) < MAX_AHEAD and (not ahead or offset(nxt) <= horizon):
            prompt = replay.prompt(nxt)
            body = build_body(lv.target, prompt, lv.opts, settings(prompt, lv.opts, nxt))
            ahead.append((nxt, prompt, body))
            nxt += 1

    async def gated(i: int, prompt: Prompt, body: bytes, due: float, at: tuple[float, int]) -> None:
        if slots is None:
            await lv.run(i, prompt, due=at, body=body)
            return
        async with slots:
            await lv.run(i, prompt, max(time.perf_counter() - due, 0.0), due=at, body=body)

    fill(offset(0) + LOOKAHEAD_S)
    lv.t0 = time.perf_counter()
    if spec.duration is not None:
        lv.deadline = lv.t0 + spec.duration
    tasks: list[asyncio.Task[None]] = []
    while ahead:
        i, prompt, body = ahead.popleft()
        due = lv.t0 + offset(i)
        if lv.deadline is not None and due >= lv.deadline:
            break
        fill(offset(i) + LOOKAHEAD_S)
        await sleep_until(due)
        tasks.append(asyncio.create_task(gated(i, prompt, body, due, (offset(i), replay.trace.rows[i].line))))
    await asyncio.gather(*tasks)


async def _closed(lv: _Level, it: Iterator[tuple[int, Work]], width: int) -> None:
    async def worker() -> None:
        # The iterator is shared: next() runs between awaits, so no item is taken twice.
        for i, work in it:
            if lv.expired():
                return
            await lv.run(i, work)

    await asyncio.gather(*(worker() for _ in range(width)))


async def _open(lv: _Level, it: Iterator[tuple[int, Work]], rng: random.Random) -> None:
    spec = lv.spec
    slots = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    rate = spec.request_rate or math.inf

    async def gated(i: int, work: Work, due: float) -> None:
        if slots is None:
            await lv.run(i, work)
            return
        async with slots:
            await lv.run(i, work, max(time.perf_counter() - due, 0.0))

    tasks: list[asyncio.Task[None]] = []
    for (i, work), offset in zip(it, arrival_offsets(rate, rng), strict=False):
        due = lv.t0 + offset
        if lv.deadline is not None and due >= lv.deadline:
            break
        await sleep_until(due)
        tasks.append(asyncio.create_task(gated(i, work, due)))
    await asyncio.gather(*tasks)
