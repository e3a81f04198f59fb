"""Measured vs reference: the comparison rows of a study, their table and `study.json` form.

Rule: error % = (measured - reference) / reference x 100, signed; a row passes when |error| is
at most the tolerance (5% by default). A range reference (R8: 3.6-4.9) has error 0 inside the
range and is measured from the nearest bound outside it. An order reference (R8: math > code >
chat) passes or fails, with no error %. A figure the run did not produce (target failed or
stopped) fails; a figure of a target the user left out of `--target` is skipped.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TypedDict

import msgspec
from rich.console import Console, JustifyMethod
from rich.table import Table

from loadgen.studies import Check, Reference, Study
from loadgen.summary import Level, Summary

DEFAULT_TOLERANCE_PCT = 5.0


def _wall_per_batch(lv: Level) -> float | None:
    """Level wall time / number of batches of C requests (closed loop, equal-length requests
    move in lockstep, so each batch takes the same time)."""
    if not lv.max_concurrency:
        return None
    batches = math.ceil((lv.completed + lv.failed) / lv.max_concurrency)
    return lv.duration / batches if batches else None


def _step_ms(lv: Level) -> float | None:
    """Verify-step time seen by the client: time per output token x tokens per verify step
    (mean TPOT x accept length); for autoregressive targets (no accept length) the TPOT."""
    if lv.mean_tpot_ms is None:
        return None
    return lv.mean_tpot_ms * (lv.accept_length or 1.0)


# Figures not stored in summary.json, computed from a level.
DERIVED: dict[str, Callable[[Level], float | None]] = {
    "wall_per_batch_s": _wall_per_batch,
    "step_ms": _step_ms,
}


class Row(msgspec.Struct, kw_only=True):
    """One line of the comparison (and of study.json's `rows`)."""

    key: str  # reference key (R1, R5-step, ...)
    id: str  # provenance id R1..R8
    what: str
    target: str  # run label (leg) the figure comes from; several for an order check
    concurrency: int | None
    metric: str
    unit: str
    reference: float | list[float] | str  # value, [low, high], or the order as text
    measured: float | list[float] | None
    error_pct: float | None
    passed: bool | None = msgspec.field(name="pass")  # None: skipped
    status: str  # pass | fail | not measured | skipped
    provenance: str
    measured_text: str = ""


class _RowBase(TypedDict):
    """The fields of a `Row` that come from its check and reference, whatever was measured."""

    key: str
    id: str
    what: str
    target: str
    concurrency: int | None
    metric: str
    unit: str
    provenance: str


def error_pct(ref: Reference, measured: float) -> float:
    """Signed relative error in percent; 0 inside a range reference."""
    if ref.value is not None:
        return (measured - ref.value) / ref.value * 100.0
    if ref.low is None or ref.high is None:
        raise ValueError(f"{ref.key} has neither a value nor a range")
    if measured < ref.low:
        return (measured - ref.low) / ref.low * 100.0
    if measured > ref.high:
        return (measured - ref.high) / ref.high * 100.0
    return 0.0


def compare(
    ref: Reference, measured: float | None, tolerance_pct: float = DEFAULT_TOLERANCE_PCT
) -> tuple[float | None, bool]:
    """(error %, passed) of one measured figure against a value or range reference."""
    if measured is None or not math.isfinite(measured):
        return None, False
    err = error_pct(ref, measured)
    return err, abs(err) <= tolerance_pct + 1e-9


def figure(summary: Summary, label: str, concurrency: int, metric: str) -> float | None:
    """A measured figure of run `label` at closed-loop level `concurrency`, or None."""
    lv = find_level(summary, label, concurrency)
    if lv is None:
        return None
    if metric in DERIVED:
        return DERIVED[metric](lv)
    v = getattr(lv, metric)
    return float(v) if v is not None else None


def find_level(summary: Summary, label: str, concurrency: int) -> Level | None:
    for run in summary.runs:
        if run.target == label:
            for lv in run.levels:
                if lv.max_concurrency == concurrency and lv.request_rate is None:
                    return lv
    return None


def evaluate(
    study: Study,
    summary: Summary,
    references: Mapping[str, Reference],
    *,
    quick: bool = False,
    skipped: Iterable[str] = (),
    tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
) -> list[Row]:
    """Every check of the study whose level was planned; `skipped` are leg labels not run."""
    skipped = set(skipped)
    legs = {leg.label: leg for leg in study.legs}
    rows: list[Row] = []
    for chk in study.checks:
        ref = references[chk.ref]
        labels = chk.legs or (chk.leg,)
        if any(chk.concurrency not in legs[lb].levels(quick) for lb in labels):
            continue  # level not planned in this mode (quick runs fewer levels)
        base = _RowBase(
            key=ref.key,
            id=ref.id,
            what=chk.what,
            target=", ".join(labels),
            concurrency=chk.concurrency or None,
            metric=chk.metric,
            unit=ref.unit,
            provenance=ref.provenance,
        )
        if any(lb in skipped for lb in labels):
            rows.append(
                Row(
                    **base,
                    reference=_ref_value(ref),
                    measured=None,
                    error_pct=None,
                    passed=None,
                    status="skipped",
                    measured_text="-",
                )
            )
            continue
        if chk.legs:
            rows.append(_order_row(chk, ref, summary, base))
            continue
        measured = figure(summary, chk.leg, chk.concurrency, chk.metric)
        err, ok = compare(ref, measured, tolerance_pct)
        rows.append(
            Row(
                **base,
                reference=_ref_value(ref),
                measured=measured,
                error_pct=err,
                passed=ok,
                status=_status(measured, ok),
                measured_text=_fmt(measured),
            )
        )
    return rows


def _order_row(chk: Check, ref: Reference, summary: Summary, base: _RowBase) -> Row:
    figures = [figure(summary, lb, chk.concurrency, chk.metric) for lb in chk.legs]
    values = [v for v in figures if v is not None]
    names = [lb.rsplit("/", 1)[-1] for lb in chk.legs]
    order = " > ".join(names)  # the legs are listed highest first
    if len(values) < len(figures):
        return Row(
            **base,
            reference=order,
            measured=None,
            error_pct=None,
            passed=False,
            status="not measured",
            measured_text="-",
        )
    ok = all(a > b for a, b in itertools.pairwise(values))
    text = (" > " if ok else " vs ").join(f"{n} {v:.2f}" for n, v in zip(names, values, strict=False))
    return Row(
        **base,
        reference=order,
        measured=values,
        error_pct=None,
        passed=ok,
        status="pass" if ok else "fail",
        measured_text=text,
    )


def _ref_value(ref: Reference) -> float | list[float] | str:
    if ref.value is not None:
        return ref.value
    if ref.low is not None and ref.high is not None:
        return [ref.low, ref.high]
    return ref.figure


def _status(measured: float | None, ok: bool) -> str:
    if measured is None:
        return "not measured"
    return "pass" if ok else "fail"


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.1f}"


def failed(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.passed is False]


def render(rows: list[Row], console: Console, *, title: str, tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> None:
    t = Table(title=title, title_justify="left", header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("ref", "left"),
        ("figure", "left"),
        ("C", "right"),
        ("reference", "right"),
        ("measured", "right"),
        ("error", "right"),
        (f"<= {tolerance_pct:g}%", "left"),
    )
    for col, just in columns:
        t.add_column(col, justify=just)
    for r in rows:
        if isinstance(r.reference, list):
            ref = f"{r.reference[0]:g}-{r.reference[1]:g}"
        elif isinstance(r.reference, float):
            ref = f"{r.reference:g}"
        else:
            ref = r.reference
        unit = f" {r.unit}" if r.unit and r.measured_text not in ("-", "") and not isinstance(r.measured, list) else ""
        err = "-" if r.error_pct is None else f"{r.error_pct:+.1f}%"
        if isinstance(r.reference, list) and r.error_pct == 0.0:
            err = "in range"
        verdict = {
            "pass": "[green]pass[/]",
            "fail": "[red]FAIL[/]",
            "not measured": "[red]not measured[/]",
            "skipped": "[yellow]skipped[/]",
        }[r.status]
        t.add_row(
            r.key,
            r.what,
            "-" if r.concurrency is None else str(r.concurrency),
            ref + (f" {r.unit}" if r.unit and not isinstance(r.reference, str) else ""),
            r.measured_text + unit,
            err,
            verdict,
        )
    console.print(t)


class GatewayRow(msgspec.Struct, kw_only=True):
    concurrency: int
    gateway_tok_s: float | None
    best_backend: str | None
    best_tok_s: float | None
    ratio: float | None  # gateway / best single backend, aggregate tok/s
    gateway_backends: dict[str, int]


def gateway_vs_best(summary: Summary, gateway_label: str = "gateway") -> list[GatewayRow]:
    """Aggregate tok/s of the gateway against the best single backend, level by level."""
    gw = next((r for r in summary.runs if r.target == gateway_label), None)
    if gw is None:
        return []
    out = []
    for lv in gw.levels:
        c = lv.max_concurrency
        if c is None:
            continue
        best, best_v = None, None
        for run in summary.runs:
            if run.target == gateway_label:
                continue
            other = find_level(summary, run.target, c)
            if other is not None and (best_v is None or other.output_throughput > best_v):
                best, best_v = run.target, other.output_throughput
        out.append(
            GatewayRow(
                concurrency=c,
                gateway_tok_s=lv.output_throughput,
                best_backend=best,
                best_tok_s=best_v,
                ratio=lv.output_throughput / best_v if best_v else None,
                gateway_backends=dict(lv.backends),
            )
        )
    return out


def render_gateway(rows: list[GatewayRow], console: Console) -> None:
    t = Table(title="gateway vs the best single backend (aggregate tok/s)", title_justify="left", header_style="bold")
    for col in ("C", "gateway", "best backend", "best tok/s", "gateway / best", "routed to"):
        t.add_column(col, justify="left" if col in ("best backend", "routed to") else "right")
    for r in rows:
        routed = " ".join(f"{k}:{n}" for k, n in sorted(r.gateway_backends.items(), key=lambda kv: -kv[1]))
        t.add_row(
            str(r.concurrency),
            _fmt(r.gateway_tok_s),
            r.best_backend or "-",
            _fmt(r.best_tok_s),
            "-" if r.ratio is None else f"{r.ratio:.2f}x",
            routed,
        )
    console.print(t)


def acceptance(summary: Summary) -> dict[str, dict[str, dict]]:
    """Accept length per run and level, overall and per prompt domain (speculative runs)."""
    out: dict[str, dict[str, dict]] = {}
    for run in summary.runs:
        for lv in run.levels:
            if lv.accept_length is None:
                continue
            out.setdefault(run.target, {})[str(lv.max_concurrency)] = {
                "dataset": run.dataset,
                "accept_length": lv.accept_length,
                "by_domain": dict(lv.accept_length_by_domain),
            }
    return out
