"""One invocation: every target, one after the other, through every level; results saved as
they are measured.

A target that cannot be resolved, or a level in which every request failed, stops that target
with a one-line reason kept in its run (`Run.error`); the other targets still run, and the
invocation reports failure at the end.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.keep_alive import CLIENT_KEEP_ALIVE_S
from loadgen import report, timescale
from loadgen.client import RequestOptions
from loadgen.datasets import Dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.outputs import OutputDir
from loadgen.summary import RequestRecord, Run, Summary
from loadgen.targets import TargetError, resolve

RESPONSES_NOTE = (
    "--endpoint responses: max_output_tokens = --max-tokens + 2 (SGLang keeps 2 of headroom); no speculation "
    "figures (SGLang's Responses API has no sglext: accept length stays empty), no ignore_eos (answers may "
    "stop early), no per-chunk usage (ITL splits tokens by text length)"
)


class Plan(msgspec.Struct, kw_only=True):
    """Everything the command line decided."""

    targets: Sequence[str]
    gateway_url: str
    model: str | None
    dataset: Dataset
    levels: Sequence[LevelSpec]
    opts: RequestOptions
    seed: int = 0
    output: Path | None = None
    progress: bool | None = None  # None: only when stderr is a terminal
    # Display name per target word (a study shows its twins' URLs as profile names).
    labels: Mapping[str, str] = {}
    # Targets run `time_scale` x faster than real time (twins started with --time-scale):
    # results are converted back to simulated time before they are shown or saved.
    time_scale: float = 1.0
    # `--goodput`: SLOs (ttft, tpot, e2el) in ms of simulated time; empty: no goodput.
    goodput_slos_ms: Mapping[str, float] = {}


def connection_limit(levels: Sequence[LevelSpec]) -> int:
    """aiohttp pool size: at least the largest concurrency; 0 (unbounded) for uncapped levels."""
    if any(lv.concurrency is None for lv in levels):
        return 0
    return max(lv.concurrency or 1 for lv in levels)


async def execute(
    plan: Plan,
    console: Console | None = None,
    err_console: Console | None = None,
    *,
    summary: Summary | None = None,
    out: OutputDir | None = None,
) -> tuple[Summary, list[str]]:
    """Run the plan; return the summary and the one-line errors (empty when all went well).

    `summary` and `out` let several plans (the legs of a study) add their runs to one summary
    and one output directory; by default each call starts its own."""
    console = console or report.make_console()
    err_console = err_console or Console(stderr=True)
    if out is None and plan.output is not None:
        out = OutputDir(plan.output)
    summary = Summary() if summary is None else summary
    errors: list[str] = []
    if plan.opts.endpoint == "responses":
        console.print(f"  {RESPONSES_NOTE}")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=15, sock_read=plan.opts.timeout)
    connector = aiohttp.TCPConnector(
        limit=connection_limit(plan.levels),
        limit_per_host=0,
        ttl_dns_cache=300,
        keepalive_timeout=CLIENT_KEEP_ALIVE_S,  # a target may be an SGLang server
    )
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        for word in plan.targets:
            label = plan.labels.get(word, word)
            run = Run(
                target=label,
                url="",
                dataset=plan.dataset.name,
                time_scale=None if plan.time_scale == 1.0 else plan.time_scale,
                dataset_skipped=dict(plan.dataset.skipped),
            )
            summary.runs.append(run)
            try:
                target = await resolve(
                    session, word, gateway_url=plan.gateway_url, model=plan.model, api_key=plan.opts.api_key
                )
            except TargetError as e:
                run.error = str(e)
                errors.append(str(e))
                if out:
                    out.write_summary(summary)
                continue
            if label != word:
                target = msgspec.structs.replace(target, label=label)
            run.url, run.model = target.url, target.model
            for spec in plan.levels:
                start = functools.partial(
                    run_level,
                    session,
                    target,
                    plan.dataset,
                    spec,
                    plan.opts,
                    seed=plan.seed,
                    # judged on the wall clock: a twin at time scale F takes F x the simulated time
                    goodput_slos_ms={k: v * plan.time_scale for k, v in plan.goodput_slos_ms.items()},
                )
                result = await _with_progress(plan, spec, label, err_console, start)
                if plan.time_scale != 1.0:
                    result = timescale.to_simulated(result, plan.time_scale)
                run.levels.append(result.level)
                if out:
                    out.add_requests(result.records)
                    out.write_summary(summary)
                report.print_level(run, result.level, console)
                if result.level.completed == 0 and result.level.failed > 0:
                    first = next(r for r in result.records if r.error)
                    run.error = (
                        f"target {label!r}: all {result.level.failed} requests failed at "
                        f"C={spec.concurrency} ({first.error}: {first.error_detail})"
                    )
                    errors.append(run.error)
                    if out:
                        out.write_summary(summary)
                    break
    return summary, errors


async def _with_progress(
    plan: Plan,
    spec: LevelSpec,
    word: str,
    console: Console,
    start: Callable[..., Awaitable[LevelResult]],
) -> LevelResult:
    """Run `start(on_record=...)` under a live progress bar when stderr is a terminal."""
    show = console.is_terminal if plan.progress is None else plan.progress
    if not show:
        return await start(on_record=None)
    total = None if spec.duration is not None else spec.num_prompts
    label = f"{word} C={spec.concurrency or 'inf'}"
    if spec.request_rate is not None:
        label += f" @{spec.request_rate:g}/s"
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tok]:,} tok  {task.fields[fail]} failed"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=total, tok=0, fail=0)
        counts = {"tok": 0, "fail": 0}

        def on_record(rec: RequestRecord) -> None:
            if rec.ok:
                counts["tok"] += rec.output_tokens
            else:
                counts["fail"] += 1
            progress.update(task, advance=1, tok=counts["tok"], fail=counts["fail"])

        return await start(on_record=on_record)
