"""Terminal reports: a row per finished level, the side-by-side table, and `compare`.

`print_table(summary)` is the public entry point the demo uses: it takes a Summary, its dict
form, or a path to summary.json, and prints one row per (concurrency level, target) so targets
sit next to each other at every level.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.metrics import ON_TIME_SHARE, TRACE_ON_TIME_TARGET
from loadgen.summary import Level, PriorityLevel, Run, Summary, load_summary


def make_console(stderr: bool = False) -> Console:
    """A console that does not squeeze tables to 80 columns when output is piped to a file."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=200)


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _level_key(lv: Level) -> str:
    c = "inf" if lv.max_concurrency is None else str(lv.max_concurrency)
    return c if lv.request_rate is None else f"{c} @{lv.request_rate:g}/s"


def _backends(lv: Level) -> str:
    return " ".join(f"{k}:{n}" for k, n in sorted(lv.backends.items(), key=lambda kv: -kv[1]))


_COLUMNS: tuple[tuple[str, Callable[[Level], str]], ...] = (
    ("single tok/s", lambda lv: _num(lv.mean_request_output_throughput)),
    ("agg tok/s", lambda lv: _num(lv.output_throughput)),
    ("wall s", lambda lv: _num(lv.duration, 2)),
    ("TTFT p50 ms", lambda lv: _num(lv.median_ttft_ms)),
    ("TTFT p99 ms", lambda lv: _num(lv.p99_ttft_ms)),
    ("answer p50 ms", lambda lv: _num(lv.median_ttft_answer_ms)),
    ("TPOT ms", lambda lv: _num(lv.mean_tpot_ms, 2)),
    ("ITL p50 ms", lambda lv: _num(lv.median_itl_ms, 2)),
    ("accept", lambda lv: _num(lv.accept_length, 2)),
    ("cache %", lambda lv: _num(None if lv.cache_hit_rate is None else 100 * lv.cache_hit_rate)),
    ("ok/fail", lambda lv: f"{lv.completed}/{lv.failed}"),
    ("backends", _backends),
)


def _goodput(lv: Level) -> str:
    g = lv.goodput
    return "-" if g is None else f"{g.request_goodput:,.2f} ({100 * g.slo_attainment:.0f}%)"


# Shown when a level of the table has SLO goodput (`--goodput`): good requests/s and their share.
_GOODPUT_COLUMN: tuple[str, Callable[[Level], str]] = ("goodput req/s", _goodput)


def _columns(levels: list[Level]) -> tuple[tuple[str, Callable[[Level], str]], ...]:
    if not any(lv.goodput for lv in levels):
        return _COLUMNS
    return (*_COLUMNS[:-1], _GOODPUT_COLUMN, _COLUMNS[-1])


def _table(title: str | None, columns: tuple[tuple[str, Callable[[Level], str]], ...] = _COLUMNS) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("C", justify="right")
    t.add_column("target")
    for name, _ in columns:
        t.add_column(name, justify="left" if name == "backends" else "right")
    return t


def _row(
    t: Table,
    run: Run,
    lv: Level,
    columns: tuple[tuple[str, Callable[[Level], str]], ...] = _COLUMNS,
    *,
    end_section: bool = False,
) -> None:
    t.add_row(_level_key(lv), run.target, *(fmt(lv) for _, fmt in columns), end_section=end_section)


def print_level(run: Run, level: Level, console: Console | None = None) -> None:
    """The table of one finished level, printed as soon as it is measured."""
    console = console or make_console()
    columns = _columns([level])
    t = _table(None, columns)
    _row(t, run, level, columns)
    console.print(t)
    if level.errors:
        errs = ", ".join(f"{k}: {n}" for k, n in sorted(level.errors.items()))
        console.print(f"[yellow]  errors: {errs}[/]")
    if level.token_count_mismatches:
        console.print(f"[yellow]  token count mismatches (client vs server usage): {level.token_count_mismatches}[/]")
    for note in level_notes(level):
        console.print(f"  {note}")
    if level.turns:
        console.print(turn_table(level))
    if level.by_priority:
        console.print(priority_table([(run, level)]))


def level_notes(level: Level) -> list[str]:
    """One line per thing a level's row does not show: how ITL knew tokens per chunk, thinking,
    tool calls."""
    notes = []
    if level.request_rate is not None and level.duration > 0:
        achieved = (level.completed + level.failed) / level.duration
        wait = level.p99_client_wait_ms
        if wait is not None and wait >= 100:  # arrivals queued in the client: the row's latencies exclude it
            notes.append(
                f"open loop: {achieved:.2f} requests/s sent of {level.request_rate:g}/s asked; arrivals waited for "
                f"one of the {level.max_concurrency} slots, mean {level.mean_client_wait_ms:,.0f} ms, p99 "
                f"{wait:,.0f} ms, before being sent (latencies count from the send)"
            )
    if level.trace_on_time is not None:
        notes.append(trace_note(level))
    if level.itl_token_counts in ("text_length", "mixed"):
        exact = level.itl_exact_requests
        notes.append(
            f"ITL: tokens per chunk split by text length for {level.completed - exact} of {level.completed} requests "
            "(no per-chunk usage from the server: --continuous-usage needs stream_options.continuous_usage_stats)"
        )
    if level.reasoning_requests:
        per = level.total_reasoning_tokens / level.reasoning_requests
        notes.append(
            f"thinking: {level.reasoning_requests} requests, {per:,.0f} reasoning tokens each; "
            f"first reasoning p50 {_num(level.median_ttft_reasoning_ms)} ms, "
            f"first answer p50 {_num(level.median_ttft_answer_ms)} ms"
        )
    if level.tool_call_requests:
        notes.append(f"tool calls: {level.tool_call_requests} of {level.completed} answers")
    if level.goodput is not None:
        g = level.goodput
        slos = ", ".join(f"{name} <= {ms / 1000:g} s" for name, ms in g.goodput_slos_ms.items())
        each = ", ".join(f"{name} {100 * share:.1f}%" for name, share in g.slo_attainment_by_metric.items())
        notes.append(
            f"goodput ({slos}): {g.request_goodput:,.2f} requests/s met every SLO, "
            f"{100 * g.slo_attainment:.1f}% of those sent (each SLO: {each})"
        )
    return notes


def trace_note(level: Level) -> str:
    """How closely a trace replay's sends followed the trace, and what the prefix cache made of it."""
    share = level.trace_on_time or 0.0
    verdict = "meets" if share >= TRACE_ON_TIME_TARGET else "MISSES"
    cache = (
        f"; {100 * level.cache_hit_rate:.1f}% of prompt tokens were cached" if level.cache_hit_rate is not None else ""
    )
    return (
        f"trace replay: {level.trace_requests} requests at {level.request_rate or 0:.2f}/s sent late by p50 "
        f"{_num(level.trace_lateness_p50_ms, 1)} ms, p99 {_num(level.trace_lateness_p99_ms, 1)} ms (max "
        f"{_num(level.trace_lateness_max_ms, 1)} ms); {100 * share:.2f}% within {100 * ON_TIME_SHARE:g}% of their "
        f"due time ({verdict} the {100 * TRACE_ON_TIME_TARGET:g}% target){cache}"
    )


def turn_table(level: Level) -> Table:
    """Per-turn figures of a session level: how the later turns (longer history, cached prefix) fare."""
    t = Table(title=f"per turn ({level.sessions} sessions)", title_justify="left", header_style="bold")
    for name in ("turn", "ok/fail", "TTFT p50 ms", "answer p50 ms", "E2E p50 ms", "input tok", "cached tok", "cache %"):
        t.add_column(name, justify="right")
    for tl in level.turns:
        t.add_row(
            str(tl.turn + 1),
            f"{tl.completed}/{tl.failed}",
            _num(tl.median_ttft_ms),
            _num(tl.median_ttft_answer_ms),
            _num(tl.median_e2e_latency_ms),
            _num(tl.mean_input_tokens, 0),
            _num(tl.mean_cached_tokens, 0),
            _num(None if tl.cache_hit_rate is None else 100 * tl.cache_hit_rate),
        )
    return t


_PRIORITY_COLUMNS: tuple[tuple[str, Callable[[PriorityLevel], str]], ...] = (
    ("priority", lambda p: str(p.priority)),
    ("ok/fail", lambda p: f"{p.completed}/{p.failed}"),
    ("TTFT p50 ms", lambda p: _num(p.median_ttft_ms)),
    ("TTFT p99 ms", lambda p: _num(p.p99_ttft_ms)),
    ("E2E p50 ms", lambda p: _num(p.median_e2e_latency_ms)),
    ("E2E p99 ms", lambda p: _num(p.p99_e2e_latency_ms)),
    ("single tok/s", lambda p: _num(p.mean_request_output_throughput)),
)


def priority_table(rows: list[tuple[Run, Level]], title: str = "per priority", *, keys: bool = False) -> Table:
    """A row per priority value sent at each of `rows`' levels: what each class gets under the same
    load. `keys`: lead with the level and target columns (the end-of-run table spans several)."""
    t = Table(title=title, title_justify="left", header_style="bold")
    if keys:
        t.add_column("C", justify="right")
        t.add_column("target")
    for name, _ in _PRIORITY_COLUMNS:
        t.add_column(name, justify="right")
    for i, (run, lv) in enumerate(rows):
        for j, pl in enumerate(lv.by_priority):
            lead = [_level_key(lv), run.target] if keys else []
            last = j + 1 == len(lv.by_priority) and i + 1 < len(rows)
            t.add_row(*lead, *(fmt(pl) for _, fmt in _PRIORITY_COLUMNS), end_section=last)
    return t


def print_table(
    summary: Summary | dict[str, Any] | str | Path,
    console: Console | None = None,
    title: str | None = "loadgen results",
) -> None:
    """Side-by-side table of every target of a summary, grouped by load level."""
    summary = load_summary(summary)
    console = console or make_console()
    columns = _columns([lv for run in summary.runs for lv in run.levels])
    t = _table(title, columns)
    keys: list[str] = []
    for run in summary.runs:
        for lv in run.levels:
            if _level_key(lv) not in keys:
                keys.append(_level_key(lv))
    rows = [(run, lv) for key in keys for run in summary.runs for lv in run.levels if _level_key(lv) == key]
    for i, (run, lv) in enumerate(rows):
        last = i + 1 == len(rows) or _level_key(rows[i + 1][1]) != _level_key(lv)
        _row(t, run, lv, columns, end_section=last)
    console.print(t)
    for key in keys:
        issued = {run.target: lv.completed + lv.failed for run, lv in rows if _level_key(lv) == key}
        if len(set(issued.values())) > 1:
            counts = ", ".join(f"{target} {n}" for target, n in issued.items())
            console.print(
                f"[yellow]{key}: the targets were sent different numbers of requests ({counts}; --duration "
                "sends until time is up): their per-request figures average over different prompts[/]"
            )
    with_priority = [(run, lv) for run, lv in rows if lv.by_priority]
    if with_priority:
        console.print(priority_table(with_priority, title="per priority", keys=True))
    for run in summary.runs:
        if run.dataset_skipped:
            skipped = ", ".join(f"{n} with {why}" for why, n in sorted(run.dataset_skipped.items()))
            console.print(f"[yellow]{run.target}: dataset entries skipped: {skipped}[/]")
        if run.error:
            console.print(f"[red]{run.target}: {run.error}[/]")


_RATIOS: tuple[tuple[str, str], ...] = (
    ("aggregate tok/s", "output_throughput"),
    ("single tok/s", "mean_request_output_throughput"),
    ("wall s", "duration"),
    ("TTFT p50", "median_ttft_ms"),
    ("TTFT p99", "p99_ttft_ms"),
    ("answer p50", "median_ttft_answer_ms"),
    ("TPOT", "mean_tpot_ms"),
    ("ITL p50", "median_itl_ms"),
    ("accept", "accept_length"),
)


def _pairs(a: Summary, b: Summary) -> list[tuple[Run, Run]]:
    """Runs of the same target; with no common target, the runs in order."""
    by_name = {r.target: r for r in b.runs}
    common = [(r, by_name[r.target]) for r in a.runs if r.target in by_name]
    return common or list(zip(a.runs, b.runs, strict=False))


def compare(
    a_src: Summary | dict[str, Any] | str | Path,
    b_src: Summary | dict[str, Any] | str | Path,
    console: Console | None = None,
) -> list[dict[str, float | None]]:
    """Print B / A for each metric at each level both summaries measured; return the ratios."""
    a, b = load_summary(a_src), load_summary(b_src)
    console = console or make_console()
    t = Table(title="B / A", title_justify="left", header_style="bold")
    t.add_column("C", justify="right")
    t.add_column("target (A -> B)")
    for name, _ in _RATIOS:
        t.add_column(name, justify="right")
    out: list[dict[str, float | None]] = []
    for ra, rb in _pairs(a, b):
        levels_b = {_level_key(lv): lv for lv in rb.levels}
        for la in ra.levels:
            lb = levels_b.get(_level_key(la))
            if lb is None:
                continue
            ratios = {field: _ratio(getattr(la, field), getattr(lb, field)) for _, field in _RATIOS}
            out.append(ratios)
            name = ra.target if ra.target == rb.target else f"{ra.target} -> {rb.target}"
            t.add_row(
                _level_key(la), name, *(_num(ratios[f], 3) + ("x" if ratios[f] is not None else "") for _, f in _RATIOS)
            )
    console.print(t)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a
