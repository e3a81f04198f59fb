"""`specroute sim calibrate`: the twin against every reference figure R1-R8 of docs/studies.md, and
(calibrate_axes.py) one row per traffic axis with its published or derived source figure.

Each figure is measured through a *driver* (anything with `level(profile, concurrency,
num_requests, max_tokens, domain) -> LevelResult`): the engine on a virtual clock for all of
them, and real HTTP against twin processes (wall clock, scaled) for a cross-check of the
figures that exercise the server's step loop. A load-generator driver can be slotted in the
same way. Exit status is non-zero when any error exceeds 5% (R8: a range and an ordering).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Protocol

import msgspec

from twin.profile import load_profile
from twin.virtual import LevelResult, run_closed_loop

__all__ = ["Check", "Driver", "EngineDriver", "evaluate", "main", "TOLERANCE"]

TOLERANCE = 0.05
R8_RANGE = (3.6, 4.9)


class Driver(Protocol):
    source: str

    def level(
        self, profile: str, concurrency: int, num_requests: int, max_tokens: int, domain: str | None = None
    ) -> LevelResult: ...


class EngineDriver:
    """The engine on a virtual clock: exact, deterministic, fast."""

    source = "engine"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def level(
        self, profile: str, concurrency: int, num_requests: int, max_tokens: int, domain: str | None = None
    ) -> LevelResult:
        return run_closed_loop(
            load_profile(profile), concurrency, num_requests, max_tokens, domain=domain, seed=self.seed
        )


class Check(msgspec.Struct, frozen=True):
    figure: str
    what: str
    reference: str
    measured: str
    error: float  # relative; 0 inside a range
    ok: bool
    source: str


def _rel(figure: str, what: str, ref: float, measured: float, source: str, unit: str = "") -> Check:
    err = abs(measured - ref) / ref
    return Check(figure, what, f"{ref:g}{unit}", f"{measured:.1f}{unit}", err, err <= TOLERANCE, source)


def _figures(quick: bool) -> dict[str, Callable[[Driver], list[Check]]]:
    """Figure -> measurement. `quick` shrinks request counts (for the HTTP cross-check)."""
    n1 = 1 if quick else 2
    n_dd = 4  # one request per sample math prompt: per-prompt variation averages out

    def r1(d: Driver) -> list[Check]:
        lv = d.level("k26-ar", 1, n1, 512)
        return [_rel("R1", "K2.6 AR C=1 per-request tok/s", 26.3, lv.mean_request_output_throughput, d.source)]

    def r2(d: Driver) -> list[Check]:
        lv = d.level("k26-ar", 32, 32, 512)
        return [_rel("R2", "K2.6 AR C=32 aggregate tok/s", 807.5, lv.output_throughput, d.source)]

    def r3(d: Driver) -> list[Check]:
        levels = (1, 8, 32) if quick else (1, 2, 4, 8, 16, 32)
        walls = {c: d.level("k26-ar", c, c, 512).duration_s for c in levels}
        worst = max(walls, key=lambda c: abs(walls[c] - 19.6))
        chk = _rel(
            "R3",
            f"K2.6 AR wall time per batch, worst of C={','.join(map(str, levels))} (C={worst})",
            19.6,
            walls[worst],
            d.source,
            " s",
        )
        return [chk]

    def r4(d: Driver) -> list[Check]:
        lv = d.level("qwen36-ar", 1, n1, 512)
        return [_rel("R4", "Qwen3.6 AR C=1 per-request tok/s", 26.0, lv.mean_request_output_throughput, d.source)]

    def r5(d: Driver) -> list[Check]:
        lv = d.level("qwen36-ddtree-b15", 1, n_dd, 512, "math")
        return [
            _rel("R5", "Qwen3.6 DDTree b15 C=1 tok/s", 173.0, lv.mean_request_output_throughput, d.source),
            _rel("R5", "Qwen3.6 DDTree b15 C=1 step", 87.0, lv.mean_step_s * 1000, d.source, " ms"),
        ]

    def r6(d: Driver) -> list[Check]:
        lv = d.level("qwen36-ddtree-b64", 1, n_dd, 512, "math")
        return [
            _rel("R6", "Qwen3.6 DDTree b64 C=1 tok/s", 64.0, lv.mean_request_output_throughput, d.source),
            _rel("R6", "Qwen3.6 DDTree b64 C=1 step", 77.0, lv.mean_step_s * 1000, d.source, " ms"),
        ]

    def r7(d: Driver) -> list[Check]:
        lv = d.level("k26-dflash", 32, 64 if quick else 128, 512, "math")
        return [_rel("R7", "K2.6 DFlash C=32 GSM8K-like aggregate tok/s", 2577.0, lv.output_throughput, d.source)]

    def r8(d: Driver) -> list[Check]:
        n = 24 if quick else 48
        lengths = {dom: d.level("k26-dflash", 8, n, 512, dom).accept_length for dom in ("math", "code", "chat")}
        lo, hi = R8_RANGE
        out = []
        for dom, v in lengths.items():
            shown = round(v, 1)  # the reference range is stated to one decimal
            err = 0.0 if lo <= shown <= hi else min(abs(shown - lo), abs(shown - hi)) / lo
            out.append(
                Check(
                    "R8", f"K2.6 DFlash acceptance length, {dom}", f"{lo}-{hi}", f"{v:.2f}", err, err == 0.0, d.source
                )
            )
        ordered = lengths["math"] > lengths["code"] > lengths["chat"]
        out.append(
            Check(
                "R8",
                "acceptance order math > code > chat",
                "ordered",
                "ordered" if ordered else "not ordered",
                0.0 if ordered else 1.0,
                ordered,
                d.source,
            )
        )
        return out

    return {"R1": r1, "R2": r2, "R3": r3, "R4": r4, "R5": r5, "R6": r6, "R7": r7, "R8": r8}


# Figures cross-checked over real HTTP (wall clock): the quick set stays a few seconds long.
HTTP_FIGURES_QUICK = ("R1", "R5")
HTTP_FIGURES_FULL = ("R1", "R2", "R5", "R6", "R7")


def evaluate(driver: Driver, figures: tuple[str, ...] | None = None, quick: bool = False) -> list[Check]:
    """Measure the chosen figures (all by default) through `driver`."""
    table = _figures(quick)
    out: list[Check] = []
    for fig in figures or tuple(table):
        out.extend(table[fig](driver))
    return out


def _render(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="twin calibration against docs/studies.md (error limit 5%)")
    for col in ("figure", "what", "reference", "measured", "error", "source", ""):
        table.add_column(col, justify="right" if col in ("error",) else "left")
    for c in checks:
        table.add_row(
            c.figure,
            c.what,
            c.reference,
            c.measured,
            f"{c.error * 100:.1f}%",
            c.source,
            "[green]ok[/]" if c.ok else "[red]FAIL[/]",
        )
    Console().print(table)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="specroute sim calibrate", description="twin vs the studies' reference figures R1-R8"
    )
    p.add_argument("--quick", action="store_true", help="fewer requests and a shorter HTTP cross-check (for tests)")
    p.add_argument("--no-http", action="store_true", help="engine (virtual clock) only")
    # 0.5, not faster: at C=32 a scale of 0.1 asks one twin process for ~8000 chunks per wall
    # second, which a shared 2-core machine cannot give (R2 over HTTP fell to ~550 tok/s there)
    p.add_argument("--time-scale", type=float, default=0.5, help="time scale of the twins of the HTTP cross-check")
    p.add_argument("--format", choices=["table", "json"], default="table")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    from twin.calibrate_axes import axis_checks

    checks = evaluate(EngineDriver())  # the engine is fast: always the full figure set
    checks.extend(axis_checks())  # thinking, tools' costs, cache, temperature, context
    if not args.no_http:
        from twin.http_driver import HttpDriver

        figs = HTTP_FIGURES_QUICK if args.quick else HTTP_FIGURES_FULL
        try:
            with HttpDriver(time_scale=args.time_scale) as http:
                checks.extend(evaluate(http, figs, quick=args.quick))
        except Exception as e:
            print(f"specroute sim calibrate: HTTP cross-check failed: {e}", file=sys.stderr)
            checks.append(Check("HTTP", "cross-check over real HTTP", "runs", "failed", 1.0, False, "http"))
    if args.format == "json":
        print(msgspec.json.encode(checks).decode())
    else:
        _render(checks)
    failed = [c for c in checks if not c.ok]
    if failed:
        print(f"calibration FAILED: {', '.join(sorted({c.figure for c in failed}))}", file=sys.stderr)
        return 1
    return 0
