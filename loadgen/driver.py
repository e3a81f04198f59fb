"""Load shapes: closed loop (exactly C requests in flight) and open loop (Poisson arrivals).

Closed loop runs C workers that each keep one request outstanding, so the in-flight count can
never exceed C and stays at C until the prompts (or the duration) run out. Open loop draws
exponential inter-arrival times at rate R (seeded) and, when capped by C, makes arrivals wait
for a free slot (like bench_serving's --max-concurrency); latency counts from the actual send.
Warmup requests run first at the level's own concurrency and are drained and discarded, so the
measured level starts with warm connections and the same cold queue as a "batch" of the studies.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from typing import Callable, Iterator

import aiohttp
import msgspec

from loadgen.client import RequestOptions, Target, send
from loadgen.datasets import Dataset, Prompt
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


def _prompts(dataset: Dataset, spec: LevelSpec) -> Iterator[tuple[int, Prompt]]:
    if spec.duration is not None:
        return enumerate(itertools.cycle(dataset.prompts))
    return enumerate(dataset.take(spec.num_prompts))


async def run_level(
    session: aiohttp.ClientSession,
    target: Target,
    dataset: Dataset,
    spec: LevelSpec,
    opts: RequestOptions,
    *,
    seed: int = 0,
    on_record: OnRecord | None = None,
) -> LevelResult:
    """Run warmup then the measured level; every issued request ends up in the records."""
    if spec.warmup > 0:
        width = spec.concurrency or spec.warmup
        warm = dataset.take(spec.warmup, offset=len(dataset.prompts) // 2)
        await _closed(
            session, target, iter(enumerate(warm)), width, opts, spec, None, time.perf_counter(), [], [], None
        )
    records: list[RequestRecord] = []
    gaps: list[Gap] = []
    t0 = time.perf_counter()
    deadline = t0 + spec.duration if spec.duration is not None else None
    it = _prompts(dataset, spec)
    if spec.request_rate is None:
        await _closed(session, target, it, spec.concurrency or 1, opts, spec, deadline, t0, records, gaps, on_record)
    else:
        await _open(session, target, it, opts, spec, deadline, t0, records, gaps, on_record, random.Random(seed))
    duration = time.perf_counter() - t0
    records.sort(key=lambda r: r.index)
    level = summarize(
        records,
        gaps,
        duration=duration,
        max_concurrency=spec.concurrency,
        request_rate=spec.request_rate,
        mode=spec.mode,
    )
    return LevelResult(level, records)


def _record(i: int, prompt: Prompt, target: Target, spec: LevelSpec, t0: float) -> RequestRecord:
    return RequestRecord(
        index=i,
        target=target.label,
        max_concurrency=spec.concurrency,
        request_rate=spec.request_rate,
        domain=prompt.domain,
        start_s=time.perf_counter() - t0,
        ok=False,
    )


async def _one(
    session: aiohttp.ClientSession,
    target: Target,
    i: int,
    prompt: Prompt,
    opts: RequestOptions,
    spec: LevelSpec,
    t0: float,
    records: list[RequestRecord],
    gaps: list[Gap],
    on_record: OnRecord | None,
) -> None:
    rec = _record(i, prompt, target, spec, t0)
    gaps.extend(await send(session, target, prompt, opts, rec))
    records.append(rec)
    if on_record is not None:
        on_record(rec)


async def _closed(
    session: aiohttp.ClientSession,
    target: Target,
    it: Iterator[tuple[int, Prompt]],
    width: int,
    opts: RequestOptions,
    spec: LevelSpec,
    deadline: float | None,
    t0: float,
    records: list[RequestRecord],
    gaps: list[Gap],
    on_record: OnRecord | None,
) -> None:
    async def worker() -> None:
        # The iterator is shared: next() runs between awaits, so no prompt is taken twice.
        for i, prompt in it:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            await _one(session, target, i, prompt, opts, spec, t0, records, gaps, on_record)

    await asyncio.gather(*(worker() for _ in range(width)))


async def _open(
    session: aiohttp.ClientSession,
    target: Target,
    it: Iterator[tuple[int, Prompt]],
    opts: RequestOptions,
    spec: LevelSpec,
    deadline: float | None,
    t0: float,
    records: list[RequestRecord],
    gaps: list[Gap],
    on_record: OnRecord | None,
    rng: random.Random,
) -> None:
    slots = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    rate = spec.request_rate or math.inf

    async def gated(i: int, prompt: Prompt) -> None:
        if slots is None:
            await _one(session, target, i, prompt, opts, spec, t0, records, gaps, on_record)
            return
        async with slots:
            await _one(session, target, i, prompt, opts, spec, t0, records, gaps, on_record)

    tasks: list[asyncio.Task[None]] = []
    for (i, prompt), offset in zip(it, arrival_offsets(rate, rng)):
        due = t0 + offset
        if deadline is not None and due >= deadline:
            break
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(gated(i, prompt)))
    await asyncio.gather(*tasks)
