"""PNG plots of a summary: throughput and TTFT against concurrency, one line per target.

matplotlib is imported here only (Agg backend, no display needed), so the rest of loadgen runs
without it; the CLI skips plots with a note when it is missing. Open-loop levels are plotted
against their concurrency cap; uncapped levels are left out (no x value).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from loadgen.summary import Level, Summary, load_summary

PLOTS = {
    "throughput_aggregate.png": ("aggregate output tok/s", "output_throughput"),
    "throughput_single.png": ("single-request output tok/s", "mean_request_output_throughput"),
}


def _series(levels: list[Level], field: str) -> tuple[list[int], list[float]]:
    pts = sorted(
        (lv.max_concurrency, getattr(lv, field))
        for lv in levels
        if lv.max_concurrency is not None and getattr(lv, field) is not None
    )
    return [c for c, _ in pts], [v for _, v in pts]


def _axes(title: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ax.set_title(title)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _finish(fig, ax, path: Path, xs: set[int]) -> None:
    if xs:
        ax.set_xticks(sorted(xs), [str(x) for x in sorted(xs)])
    if ax.lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# A reference figure drawn on a plot: (concurrency, value, label), keyed by the plotted field.
RefPoints = dict[str, list[tuple[int, float, str]]]


def write_plots(source: Summary | dict | str | Path, out_dir: Path, references: RefPoints | None = None) -> list[Path]:
    """Write the PNGs into `out_dir`; return their paths. `references` (a study's) are drawn
    as black crosses on the throughput plots."""
    summary = load_summary(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, (label, field) in PLOTS.items():
        fig, ax = _axes(f"{label} vs concurrency", label)
        xs: set[int] = set()
        for run in summary.runs:
            x, y = _series(run.levels, field)
            if x:
                ax.plot(x, y, marker="o", label=run.target)
                xs.update(x)
        for c, v, text in (references or {}).get(field, []):
            ax.plot([c], [v], marker="x", markersize=10, color="black", linestyle="none", label=text)
            xs.add(c)
        _finish(fig, ax, out_dir / name, xs)
        written.append(out_dir / name)
    fig, ax = _axes("TTFT vs concurrency", "TTFT (ms)")
    xs = set()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(summary.runs):
        for field, style in (("median_ttft_ms", "-"), ("p99_ttft_ms", "--")):
            x, y = _series(run.levels, field)
            if x:
                tag = "p50" if field.startswith("median") else "p99"
                ax.plot(x, y, style, marker="o", color=colors[i % len(colors)], label=f"{run.target} {tag}")
                xs.update(x)
    _finish(fig, ax, out_dir / "ttft.png", xs)
    written.append(out_dir / "ttft.png")
    return written
