"""Terminal reports: a row per finished level, the side-by-side table, and `compare`.

`print_table(summary)` is the public entry point the demo uses: it takes a Summary, its dict
form, or a path to summary.json, and prints one row per (concurrency level, target) so targets
sit next to each other at every level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from loadgen.summary import Level, Run, Summary, load_summary


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
    ("TPOT ms", lambda lv: _num(lv.mean_tpot_ms, 2)),
    ("ITL p50 ms", lambda lv: _num(lv.median_itl_ms, 2)),
    ("accept", lambda lv: _num(lv.accept_length, 2)),
    ("ok/fail", lambda lv: f"{lv.completed}/{lv.failed}"),
    ("backends", _backends),
)


def _table(title: str | None) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("C", justify="right")
    t.add_column("target")
    for name, _ in _COLUMNS:
        t.add_column(name, justify="left" if name == "backends" else "right")
    return t


def _row(t: Table, run: Run, lv: Level, *, end_section: bool = False) -> None:
    t.add_row(_level_key(lv), run.target, *(fmt(lv) for _, fmt in _COLUMNS), end_section=end_section)


def print_level(run: Run, level: Level, console: Console | None = None) -> None:
    """The table of one finished level, printed as soon as it is measured."""
    console = console or make_console()
    t = _table(None)
    _row(t, run, level)
    console.print(t)
    if level.errors:
        errs = ", ".join(f"{k}: {n}" for k, n in sorted(level.errors.items()))
        console.print(f"[yellow]  errors: {errs}[/]")
    if level.token_count_mismatches:
        console.print(f"[yellow]  token count mismatches (client vs server usage): {level.token_count_mismatches}[/]")


def print_table(
    summary: Summary | dict | str | Path, console: Console | None = None, title: str | None = "loadgen results"
) -> None:
    """Side-by-side table of every target of a summary, grouped by load level."""
    summary = load_summary(summary)
    console = console or make_console()
    t = _table(title)
    keys: list[str] = []
    for run in summary.runs:
        for lv in run.levels:
            if _level_key(lv) not in keys:
                keys.append(_level_key(lv))
    rows = [(run, lv) for key in keys for run in summary.runs for lv in run.levels if _level_key(lv) == key]
    for i, (run, lv) in enumerate(rows):
        last = i + 1 == len(rows) or _level_key(rows[i + 1][1]) != _level_key(lv)
        _row(t, run, lv, end_section=last)
    console.print(t)
    for run in summary.runs:
        if run.error:
            console.print(f"[red]{run.target}: {run.error}[/]")


_RATIOS: tuple[tuple[str, str], ...] = (
    ("aggregate tok/s", "output_throughput"),
    ("single tok/s", "mean_request_output_throughput"),
    ("wall s", "duration"),
    ("TTFT p50", "median_ttft_ms"),
    ("TTFT p99", "p99_ttft_ms"),
    ("TPOT", "mean_tpot_ms"),
    ("ITL p50", "median_itl_ms"),
    ("accept", "accept_length"),
)


def _pairs(a: Summary, b: Summary) -> list[tuple[Run, Run]]:
    """Runs of the same target; with no common target, the runs in order."""
    by_name = {r.target: r for r in b.runs}
    common = [(r, by_name[r.target]) for r in a.runs if r.target in by_name]
    return common or list(zip(a.runs, b.runs))


def compare(
    a_src: Summary | dict | str | Path, b_src: Summary | dict | str | Path, console: Console | None = None
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
