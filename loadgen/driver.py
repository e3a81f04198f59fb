"""Load shapes: closed loop (exactly C requests in flight) and open loop (Poisson arrivals).

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

With `RequestOptions.chain_responses` (`--endpoint responses`) the history stays on the server
instead: every turn is stored (`store: true`), and each turn after the first sends only its new
user message with `previous_response_id` = the previous turn's response id; records carry both ids.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import aiohttp
import msgspec

from loadgen.client import RequestOptions, Target, send
from loadgen.conversations import assistant_message, session_messages
from loadgen.datasets import Dataset, Message, Prompt, Session
from loadgen.metrics import Gap, summarize
from loadgen.summary import Level, RequestRecord

OnRecord = Callable[[RequestRecord], None]


class LevelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One load level. `concurrency` None = uncapped (open loop only); `request_rate` None =
    closed loop; `duration` set = issue requests until it elapses instead of `num_prompts`."""

    concurrency: int | None
    request_rate: float | None = None
    num_prompts: int = 0
    duration: float | None = None
    warmup: int = 0

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


Work = Prompt | Session  # what one closed-loop worker or one open-loop arrival takes


def _work(dataset: Dataset, spec: LevelSpec) -> Iterator[tuple[int, Work]]:
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

    async def run(self, i: int, work: Work, waited_s: float | None = None) -> None:
        """`waited_s`: how long its arrival waited for a free slot (open loop with a cap)."""
        if isinstance(work, Session):
            await self._session(i, work, waited_s)
            return
        rec = self.record(i, work.domain, waited_s)
        sent = await send(self.http, self.target, work, self.opts, rec, index=i)
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
    it = _work(dataset, spec)
    if spec.request_rate is None:
        await _closed(lv, it, spec.concurrency or 1)
    else:
        await _open(lv, it, random.Random(seed))
    duration = time.perf_counter() - lv.t0
    records = sorted(lv.records, key=lambda r: r.index)
    level = summarize(
        records,
        lv.gaps,
        duration=duration,
        max_concurrency=spec.concurrency,
        request_rate=spec.request_rate,
        mode=spec.mode,
        goodput_slos_ms=goodput_slos_ms,
    )
    return LevelResult(level, records)


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
