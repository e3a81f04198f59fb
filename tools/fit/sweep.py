"""The measurement sweep of `specroute profile`: which rounds it sends, in which order, and when it stops.

Against an otherwise idle server (refused when `/v1/loads` shows requests at the start):

1. prefill: one request alone per prompt length (up to `max_prompt_tokens`), `max_tokens` 1;
2. step: a round at each concurrency level up to the server's cap, short prompts of the three
   domains, greedy, thinking off, `ignore_eos` (every request the same length);
3. context: rounds of long prompts (as many sequences as the KV pool holds), which give step time
   against the KV the batch reads and acceptance against context length;
4. acceptance (speculative servers): a round per domain and temperature (0, 0.6, 1.0); on an
   NGRAM server each greedy round is sent twice, the second time measuring the acceptance inside
   a copy of the server's own output;
5. lengths (a model that ends its answers): without `ignore_eos`, at temperature 0.6, for the
   reasoning and answer lengths; behind a reasoning parser each round sends thinking on and off
   together. A round's token budget is what a request decodes in the round's time at the speed
   the acceptance (or, without speculation, step) rounds measured; requests still running at it
   count as censored.

The quick sweep sends fewer and shorter rounds (3-4.5 minutes on a K2.6 twin at time scale 1); the
full one more levels, lengths and repeats. No round uses the concurrency levels 3, 12, 24, the
prompt lengths 4096 and 16384: those are held out to check the fit (`specroute profile validate`).

The measurements are saved after every round, so a sweep that stops early keeps them: the server
failed (`SweepStopped`), another client started sending (`ForeignLoad`), the user interrupted.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec

from backends import BackendSpec
from backends.client import SGLangClient
from tools.fit.discover import ServerFacts, discover
from tools.fit.measurements import Level, Measurements, save_measurements
from tools.fit.prompts import DOMAINS, PromptMaker
from tools.fit.rounds import ForeignLoad, RoundSpec, calibrate, run_round

__all__ = [
    "SweepPlan",
    "SweepRefused",
    "SweepStopped",
    "describe_times",
    "length_rounds",
    "plan_sweep",
    "sampled_tok_s",
    "server_busy_s",
    "sweep",
    "time_by_kind",
]

SHORT = 64  # tokens of a "short" prompt: the question alone
TEMPERATURES = (0.0, 0.6, 1.0)
LENGTHS_TEMPERATURE = 0.6  # the lengths rounds sample as a chat client does
HELD_OUT_CONCURRENCY = frozenset({3, 12, 24})
HELD_OUT_PROMPTS = frozenset({4096, 16384})
MIN_CELL = 8  # requests per (domain, temperature) cell at least
# Requests of one round at most: an AR server's cap is SGLang's request pool (2048 and more), far beyond
# what a batch of a sweep's lengths needs to show its cost; the step law is fitted up to this.
MAX_ROUND = 512
# Prompt tokens of one quick context round at most: its prefill measures nothing the prefill rounds
# do not, and eight 32K prompts of a 27B model on one GPU took a minute of a five-minute sweep.
QUICK_CONTEXT_TOKENS = 131072
MAX_LENGTH_ROUNDS = 6  # per thinking setting: a small cap gets fewer length samples, not hours of rounds


class SweepRefused(RuntimeError):
    """The server cannot be profiled (unreachable, busy, unreadable): nothing was measured."""


class SweepStopped(RuntimeError):
    """The sweep stopped part-way; what it measured is kept."""


class SweepPlan(msgspec.Struct, kw_only=True):
    mode: str
    prefill_lengths: list[int]
    prefill_repeats: int
    step_levels: list[int]
    step_tokens: int
    step_repeats: int
    context: list[tuple[int, int]]  # (concurrency, prompt tokens)
    context_tokens: int
    accept_concurrency: int
    accept_tokens: int
    accept_repeats: int
    accept_passes: int  # verify passes a request of an acceptance round needs, at most `accept_tokens` long
    lengths_per_domain: int
    lengths_budget_s: float  # seconds a lengths round may take (its max_tokens follows from it)
    max_prompt_tokens: int


def _levels(cap: int, full: bool) -> list[int]:
    """Doubling concurrency up to `cap` (the server's, or what its KV pool or the sweep's limit
    allows), `cap` itself, and 5/8 of it (a point between the top two, where a compute knee shows),
    none of them a held-out level (one less instead)."""
    ladder = [1, 2, 4, 6, 8, 16, 32, 48, 64, 96, 128, 192, 256] if full else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    knee = max(1, round(cap * 5 / 8))
    # quick: no ladder level within 15% of that point (a cap of 48: 30, not 30 and 32)
    wanted = [c for c in ladder if c < cap and (full or c <= 2 or abs(c - knee) > 0.15 * knee)] + [cap, knee]
    return sorted({c - 1 if c in HELD_OUT_CONCURRENCY else c for c in wanted})


def _lengths(bound: int, full: bool) -> list[int]:
    ladder = [512, 1536, 3072, 6144, 12288, 24576, 49152, 98304] if full else [1536, 6144, 12288, 24576]
    out = [SHORT] + [n for n in ladder if n <= bound and n not in HELD_OUT_PROMPTS]
    if bound not in HELD_OUT_PROMPTS and bound > out[-1] * 1.25:
        out.append(bound)
    return out


def plan_sweep(facts: ServerFacts, *, quick: bool, max_prompt_tokens: int | None = None) -> SweepPlan:
    cap = facts.max_running_requests or 1
    context_len = facts.context_length or 32768
    full = not quick
    out_tokens = 192 if full else 96
    bound = min(max_prompt_tokens or (65536 if full else 32768), context_len - out_tokens - 64)
    kv = facts.max_total_tokens or (cap * 4096)
    lengths = _lengths(bound, full)
    context: list[tuple[int, int]] = []
    for p in lengths[1:]:
        if p < 1536:
            continue
        for c in (4, 16) if full else (16 if p <= 8192 else 8,):
            c = min(c, cap) if full else min(c, cap, max(1, QUICK_CONTEXT_TOKENS // p))
            # all of the round's sequences fit in the KV pool with room to spare
            while c > 1 and c * (p + 512) > 0.8 * kv:
                c //= 2
            if c * (p + 512) <= 0.8 * kv and (c, p) not in context:
                context.append((c, p))
    return SweepPlan(
        mode="full" if full else "quick",
        prefill_lengths=lengths,
        prefill_repeats=3 if full else 1,
        step_levels=_levels(
            min(cap, MAX_ROUND if full else MAX_ROUND // 2, int(0.8 * kv / (SHORT + out_tokens + 64))), full
        ),
        step_tokens=out_tokens,
        step_repeats=2 if full else 1,
        context=context,
        context_tokens=512 if full else 128,
        accept_concurrency=min(cap, 64 if full else 48, max(1, int(0.8 * kv / (SHORT + 512)))),
        accept_tokens=384 if full else 256,
        accept_repeats=2 if full else 1,
        accept_passes=160 if full else 48,
        lengths_per_domain=32 if full else 12,
        lengths_budget_s=240.0 if full else 55.0,
        max_prompt_tokens=bound,
    )


def _rounds(plan: SweepPlan, facts: ServerFacts) -> list[RoundSpec]:
    """Every round but the lengths ones (their token budget depends on the measured speed)."""
    out: list[RoundSpec] = []
    for p in plan.prefill_lengths:
        for k in range(plan.prefill_repeats):
            out.append(
                RoundSpec(kind="prefill", concurrency=1, prompt_tokens=p, max_tokens=1, domains=(DOMAINS[k % 3],))
            )
    for _ in range(plan.step_repeats):
        for c in plan.step_levels:
            out.append(RoundSpec(kind="step", concurrency=c, prompt_tokens=SHORT, max_tokens=plan.step_tokens))
    speculative = facts.classification is not None and facts.classification.reported is not None
    ngram = facts.classification is not None and facts.classification.twin_algorithm == "NGRAM"
    for c, p in plan.context:
        # longer answers on a speculative server: more verify passes for the acceptance at that length
        tokens = plan.context_tokens if speculative else plan.step_tokens
        out.append(RoundSpec(kind="context", concurrency=c, prompt_tokens=p, max_tokens=tokens))
    if speculative:
        # every cell gets MIN_CELL requests at least, a small cap in more rounds
        repeats = max(plan.accept_repeats, math.ceil(MIN_CELL / plan.accept_concurrency))
        for _ in range(repeats):
            for t in TEMPERATURES:
                for d in DOMAINS:
                    spec = RoundSpec(
                        kind="accept",
                        concurrency=plan.accept_concurrency,
                        prompt_tokens=SHORT,
                        max_tokens=plan.accept_tokens,
                        temperature=t,
                        domains=(d,),
                    )
                    out.append(spec)
                    if t == 0.0 and ngram:
                        # the same greedy prompts again: the server regenerates what it generated, and its
                        # n-gram trie holds it (the acceptance inside copies of its own output)
                        out.append(msgspec.structs.replace(spec, kind="copy"))
    return out


def _median_tok_s(levels: list[Level], kind: str, concurrency: int, temperature: float | None = None) -> float | None:
    """Decode tokens per second of one request (the median) in the `kind` round nearest `concurrency`
    (at `temperature`), the slowest domain's where a round has one domain."""
    best: tuple[int, float] | None = None
    for lv in levels:
        if lv.kind != kind or (temperature is not None and lv.temperature != temperature):
            continue
        speeds = [
            r.completion_tokens / (r.e2e_s - r.ttft_s)
            for r in lv.requests
            if r.e2e_s is not None and r.ttft_s is not None and r.e2e_s > r.ttft_s and not r.error
        ]
        if not speeds:
            continue
        speed = sorted(speeds)[len(speeds) // 2]
        distance = abs(lv.concurrency - concurrency)
        if best is None or distance < abs(best[0] - concurrency):
            best = (lv.concurrency, speed)
        elif distance == abs(best[0] - concurrency):
            best = (lv.concurrency, min(best[1], speed))
    return best[1] if best else None


def sampled_tok_s(levels: list[Level], concurrency: int) -> float | None:
    """Decode tokens per second of one request at `concurrency` and the lengths rounds' temperature.

    A speculative server decodes slower sampling than greedy (it accepts fewer drafts): its speed
    is the slowest domain's of the acceptance rounds at that temperature, moved to `concurrency` as
    the greedy step rounds move from the acceptance rounds' concurrency to it. Without acceptance
    rounds (an AR server: temperature costs it nothing), the step rounds' speed at `concurrency`."""
    step = _median_tok_s(levels, "step", concurrency)
    accept = [lv for lv in levels if lv.kind == "accept" and lv.temperature == LENGTHS_TEMPERATURE]
    sampled = _median_tok_s(accept, "accept", concurrency, LENGTHS_TEMPERATURE)
    if sampled is None:
        return step
    step_there = _median_tok_s(levels, "step", accept[0].concurrency)
    if step is None or step_there is None:
        return sampled
    return sampled * step / step_there


def _accept_tokens(plan: SweepPlan, levels: list[Level], domain: str) -> int:
    """An acceptance round's `max_tokens` for `domain`: what gives each request `accept_passes`
    verify passes at the tokens per pass the greedy step rounds showed, `accept_tokens` at most. A
    request's mean accepted drafts per pass is as precise as its passes are many; a server that
    accepts little (NGRAM on fresh text: ~1.3 tokens a pass) needs fewer tokens for as many, and
    its rounds at `accept_tokens` took three times a DFlash server's."""
    verify = drafts = 0
    for lv in levels:
        if lv.kind == "step":
            for r in lv.requests:
                if r.domain == domain and r.verify_ct and r.correct_drafts is not None and not r.error:
                    verify += r.verify_ct
                    drafts += r.correct_drafts
    if not verify:
        return plan.accept_tokens
    per_pass = 1.0 + drafts / verify
    return max(SHORT, min(plan.accept_tokens, math.ceil(plan.accept_passes * per_pass)))


def length_rounds(plan: SweepPlan, facts: ServerFacts, levels: list[Level]) -> list[RoundSpec]:
    """The rounds that measure the reasoning and answer lengths, sized from what the sweep measured.

    Each round's `max_tokens` is what one request decodes in `lengths_budget_s` at the speed the
    earlier rounds showed at the lengths rounds' temperature (`sampled_tok_s`), so the round ends
    within its time whatever the server accepts at that temperature; a request still running then
    is a censored sample. A thinking model's round sends thinking on and off together (thinking on
    first, `lengths_per_domain` a domain, the rest of the cap thinking off, a quarter at least): a
    round lasts as long as its longest request, a thinking one, and the thinking-off requests end
    inside it. A cap too small for one round gets more rounds, `MAX_LENGTH_ROUNDS` at most."""
    per_setting = plan.lengths_per_domain * len(DOMAINS)
    cap = facts.max_running_requests or per_setting
    if facts.thinking:
        c = min(cap, 2 * per_setting)
        off = max(c - per_setting, _whole_domains(c // 4), 1 if c > 1 else 0)
        rounds = min(MAX_LENGTH_ROUNDS, math.ceil(per_setting / max(1, c - off)))
    else:
        c, off = min(cap, per_setting), 0
        rounds = min(MAX_LENGTH_ROUNDS, math.ceil(per_setting / c))
    speed = sampled_tok_s(levels, c) or 20.0
    # within the context length too (SGLang refuses a longer max_tokens)
    budget = min(max(256, int(speed * plan.lengths_budget_s)), (facts.context_length or 32768) - 4 * SHORT)
    return [
        RoundSpec(
            kind="lengths",
            concurrency=c,
            prompt_tokens=SHORT,
            max_tokens=budget,
            temperature=LENGTHS_TEMPERATURE,
            thinking=facts.thinking,
            thinking_off=off,
            ignore_eos=False,
            # each round starts the cycle at another domain: a small round's remainder is not always math's
            domains=DOMAINS[k % len(DOMAINS) :] + DOMAINS[: k % len(DOMAINS)],
        )
        for k in range(rounds)
    ]


def _whole_domains(n: int) -> int:
    """`n` rounded down to a whole number of requests per domain (at least one of each where n allows)."""
    return n - n % len(DOMAINS) if n >= len(DOMAINS) else n


def time_by_kind(levels: list[Level]) -> dict[str, tuple[int, float, float | None]]:
    """Per kind of round, in the order the sweep ran them: rounds, wall-clock seconds, and the
    seconds the server computed (None where it keeps no counters)."""
    out: dict[str, tuple[int, float, float | None]] = {}
    for lv in levels:
        n, wall, busy = out.get(lv.kind, (0, 0.0, 0.0))
        server = lv.server_busy_s
        out[lv.kind] = (n + 1, wall + lv.wall_s, busy + server if busy is not None and server is not None else None)
    return out


def server_busy_s(levels: list[Level]) -> float | None:
    """Seconds the server computed over the sweep's rounds (None where it keeps no counters)."""
    busy = [lv.server_busy_s for lv in levels]
    return sum(b for b in busy if b is not None) if busy and None not in busy else None


def describe_times(levels: list[Level]) -> str:
    """`kind wall s (server s, rounds)` per kind of round."""
    parts = []
    for kind, (n, wall, busy) in time_by_kind(levels).items():
        server = f"server {busy:.0f} s, " if busy is not None else ""
        parts.append(f"{kind} {wall:.0f} s ({server}{n} rounds)")
    return ", ".join(parts)


def _failures(level: Level) -> list[str]:
    return [r.error for r in level.requests if r.error]


async def _run(
    facts: ServerFacts,
    plan: SweepPlan,
    m: Measurements,
    save: Callable[[], None],
    log: Callable[[str], None],
    api_key: str | None,
) -> None:
    client = SGLangClient(
        BackendSpec(name="profile", url=facts.url, model=facts.served_model_name or "", api_key=api_key),
        connections=max(64, (facts.max_running_requests or 1) * 2),
    )
    maker = PromptMaker(seed=int(time.time()))
    t0 = time.perf_counter()
    try:
        # warm-up, and the tokenizer's characters per token on the sweep's own text
        warm = await run_round(
            client, facts, maker, RoundSpec(kind="warmup", concurrency=1, prompt_tokens=SHORT, max_tokens=2)
        )
        probe = await calibrate(client, facts, maker)
        for lv in (warm, probe):
            if _failures(lv):
                raise SweepStopped(f"the first requests failed: {_failures(lv)[0]}")
        m.notes.append(f"characters per token on the sweep's text: {maker.chars_per_token:.2f}")
        speculative = facts.classification is not None and facts.classification.reported is not None
        if speculative and warm.requests[0].verify_ct is None:
            note = (
                f"no per-request speculation details (SGLang {facts.version}): acceptance cannot be measured; "
                "the sweep goes on for the step and prefill times"
            )
            m.notes.append(note)
            log(f"note: {note}")
        rounds = _rounds(plan, facts)
        total = len(rounds)
        i = 0
        while i < len(rounds):
            spec = rounds[i]
            if spec.kind in ("accept", "copy"):
                spec = msgspec.structs.replace(spec, max_tokens=_accept_tokens(plan, m.levels, spec.domains[0]))
            repeat = maker.last_round if spec.kind == "copy" else None
            level = await run_round(client, facts, maker, spec, prompts=repeat)
            m.levels.append(level)
            m.wall_s = time.perf_counter() - t0
            save()
            errors = _failures(level)
            log(
                f"[{len(m.levels)}/{total}] {spec.kind:8s} C={spec.concurrency:<4d} prompt={spec.prompt_tokens:<6d} "
                f"T={spec.temperature:<3g} thinking={'on ' if spec.thinking else 'off'} "
                f"{len(level.requests) - len(errors)} ok {len(errors)} failed  ({time.perf_counter() - t0:.0f} s)"
            )
            if errors:
                raise SweepStopped(
                    f"the server answered errors mid-sweep ({len(errors)} of {len(level.requests)} requests of a "
                    f"{spec.kind} round at C={spec.concurrency}): {errors[0]}"
                )
            i += 1
            if i == len(rounds) and not any(r.kind == "lengths" for r in rounds):
                rounds += length_rounds(plan, facts, m.levels)
                total = len(rounds)
        log(f"rounds' wall-clock time by kind: {describe_times(m.levels)}")
    finally:
        await client.close()


def sweep(
    url: str,
    *,
    quick: bool,
    measurements_path: Path,
    max_prompt_tokens: int | None = None,
    api_key: str | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> Measurements:
    """Profile the server at `url`; the measurements go to `measurements_path` after every round.
    Raises SweepRefused before anything is sent, SweepStopped (with the measurements kept) after."""
    facts = asyncio.run(discover(url, api_key=api_key))
    if facts.error:
        raise SweepRefused(f"{url}: {facts.error}")
    if facts.classification is not None and facts.classification.strategy is None:
        raise SweepRefused(f"{url}: {facts.classification.why}")
    if facts.load_path is None:
        raise SweepRefused(f"{url}: neither /v1/loads nor /get_load answered: cannot tell whether the server is idle")
    if (facts.running or 0) + (facts.waiting or 0) > 0:
        raise SweepRefused(
            f"{url}: the server is busy ({facts.running} running, {facts.waiting} waiting requests, from "
            f"{facts.load_path}): profile an otherwise idle server, its figures would be the other traffic's too"
        )
    if not facts.max_running_requests:
        raise SweepRefused(f"{url}: the server reports no max_running_requests (neither /server_info nor /v1/loads)")
    plan = plan_sweep(facts, quick=quick, max_prompt_tokens=max_prompt_tokens)
    m = Measurements(
        url=facts.url,
        date=datetime.datetime.now(datetime.UTC).date().isoformat(),
        mode=plan.mode,
        max_prompt_tokens=plan.max_prompt_tokens,
        facts=facts,
    )
    if facts.load_path != "/v1/loads":
        m.notes.append(f"{facts.load_path} only: no decode moments or prefill counters (SGLang before 0.5.23)")

    def save() -> None:
        save_measurements(m, measurements_path)

    save()
    c = facts.classification
    log(
        f"profiling {facts.url}: {facts.served_model_name}, {c.strategy if c else '?'} ({c.reported if c else None}), "
        f"cap {facts.max_running_requests}, prompts up to {plan.max_prompt_tokens} tokens, {plan.mode} sweep"
    )
    try:
        asyncio.run(_run(facts, plan, m, save, log, api_key))
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        m.stopped = f"lost the server mid-sweep: {type(e).__name__}: {e}".rstrip(": ")
        save()
        raise SweepStopped(m.stopped) from None
    except ForeignLoad as e:
        m.stopped = str(e)
        save()
        raise SweepStopped(str(e)) from None
    except SweepStopped as e:
        m.stopped = str(e)
        save()
        raise
    except KeyboardInterrupt:
        m.stopped = "interrupted"
        save()
        raise
    save()
    return m
