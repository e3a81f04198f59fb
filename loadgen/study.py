"""`loadgen study NAME`: a named study of docs/studies.md, measured and compared with its references.

    loadgen study k26-ar-sweep                       # starts the k26-ar twin, real timing
    loadgen study k26-ar-sweep --quick               # twin 20x faster, fewer prompts
    loadgen study k26-strategies --time-scale 0.1    # four K2.6 twins + a gateway, 10x faster
    loadgen study k26-ar-sweep --target http://gpu-a:30000          # a real server instead
    loadgen study k26-strategies --target k26-ar,k26-eagle3,k26-dflash,k26-ddtree,gateway \\
            --gateway-url http://gw:8000             # backends named by a real gateway
    loadgen study --list

By default the study starts its own twins (`specroute sim`, and `specroute serve --config` over
them when the gateway is a target) and stops them when it ends, however it ends. `--target`
points it at running servers instead: a comma-separated list of `NAME=TARGET` or bare items given
to the study's targets in order (a bare study target name such as `gateway` or `k26-ar` is
resolved through `--gateway-url`, as in a plain `loadgen` run). Study targets not given are
skipped, and so are their reference rows.

Outputs are those of a plain run (summary.json, summary.csv, requests.jsonl, plots) plus
`study.json` with the comparison rows. With `--time-scale F` (or `--quick`) the twins run F x
real time and every figure is converted back to simulated time before it is shown or written
(loadgen/timescale.py). Exit: 0 every figure within tolerance, 1 a figure missed or a target
failed, 2 bad command line, 130 interrupted (results so far are written).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
from rich.console import Console

from common.output_dir import output_dir
from loadgen import checks
from loadgen.client import RequestOptions
from loadgen.datasets import DatasetError, load_dataset
from loadgen.driver import LevelSpec
from loadgen.outputs import OutputDir
from loadgen.report import make_console, print_table
from loadgen.runner import Plan, execute
from loadgen.studies import REFERENCES, STUDIES, Reference, Study
from loadgen.summary import Summary
from loadgen.twins import start_topology
from tools.processes import ProcessError, ProcessGroup

QUICK_TIME_SCALE = 0.05
DEFAULT_GATEWAY = "http://127.0.0.1:8000"


class UsageError(Exception):
    """A command-line value is wrong; one line for the user."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadgen study",
        description="Run a named study of docs/studies.md and compare its figures with the "
        "references (R1-R8). Studies: " + ", ".join(STUDIES),
    )
    p.add_argument("name", nargs="?", help="study name (see --list)")
    p.add_argument("--list", action="store_true", help="list the studies and their references")
    p.add_argument("--output", type=output_dir, default=None, help="output directory (default out/studies/NAME)")
    p.add_argument(
        "--target",
        default=None,
        help="run against these servers instead of twins: comma-separated "
        "NAME=URL (or NAME=gateway / NAME=backend-name) or bare items taken "
        "in the order of the study's targets",
    )
    p.add_argument(
        "--gateway-url",
        default=os.environ.get("SPECROUTE_GATEWAY_URL", DEFAULT_GATEWAY),
        help="gateway that resolves backend names given with --target",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="twins run F x real time (0.1 = 10x faster); figures are converted "
        "back to simulated time (default 1, --quick 0.05)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"time scale {QUICK_TIME_SCALE:g} and fewer prompts/levels (a smoke test; overhead weighs 1/F more)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=checks.DEFAULT_TOLERANCE_PCT,
        help="percent error allowed per figure (default 5)",
    )
    p.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace a reference figure, e.g. R2=900 or R8=3.5-5 (own hardware, "
        "or a check of the failure path); repeatable",
    )
    p.add_argument(
        "--policy", default=None, help="routing policy of the gateway the study starts (default: the gateway's)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the twins and the prompts")
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token for --target servers (default $OPENAI_API_KEY)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds without data before a request counts as timed out"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live progress (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--plots", action=argparse.BooleanOptionalAction, default=True, help="write PNG plots (needs matplotlib)"
    )
    return p


def apply_overrides(refs: Mapping[str, Reference], items: Sequence[str]) -> dict[str, Reference]:
    """`KEY=VALUE` (value references) or `KEY=LOW-HIGH` (range references)."""
    out = dict(refs)
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in out:
            raise UsageError(
                f"--reference {item!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(k for k, r in refs.items() if r.value or r.low)}"
            )
        ref = out[key]
        try:
            if ref.value is not None:
                out[key] = msgspec.structs.replace(ref, value=float(text))
            elif ref.low is not None:
                lo, _, hi = text.partition("-")
                low, high = float(lo), float(hi)
                if low > high:
                    raise ValueError
                out[key] = msgspec.structs.replace(ref, low=low, high=high)
            else:
                raise UsageError(f"--reference {key}: an order reference has no number")
        except ValueError:
            raise UsageError(
                f"--reference {item!r}: not a number" + ("" if ref.value is not None else " range LOW-HIGH")
            ) from None
        if out[key].value == 0:
            raise UsageError(f"--reference {key}: must not be 0")
    return out


def target_words(study: Study, given: str) -> dict[str, str]:
    """Study target -> loadgen target word (URL, 'gateway' or a backend name)."""
    words: dict[str, str] = {}
    bare: list[str] = []
    for item in (x.strip() for x in given.split(",")):
        if not item:
            continue
        name, sep, word = item.partition("=")
        if sep and not name.startswith(("http://", "https://")):
            name, word = name.strip(), word.strip()
            if name not in study.targets:
                raise UsageError(
                    f"--target {item!r}: {name!r} is not a target of {study.name} ({', '.join(study.targets)})"
                )
            if not word:
                raise UsageError(f"--target {item!r}: nothing after '='")
            words[name] = word
        elif item in study.targets:
            words[item] = item  # resolved through --gateway-url like a plain run
        else:
            bare.append(item)
    free = [t for t in study.targets if t not in words]
    if len(bare) > len(free):
        raise UsageError(
            f"--target: {len(bare)} unnamed targets for {len(free)} study "
            f"target(s) ({', '.join(free) or 'none left'}); use NAME=URL"
        )
    words.update(zip(free, bare, strict=False))
    return words


def _err(msg: str) -> None:
    print(f"loadgen: error: {msg}", file=sys.stderr)


def _list(console: Console) -> None:
    for s in STUDIES.values():
        keys = sorted({c.ref for c in s.checks})
        console.print(f"[bold]{s.name}[/]  {s.title}")
        console.print(f"    targets: {', '.join(s.targets)}")
        for k in keys:
            r = REFERENCES[k]
            console.print(f"    {k:<10} {r.system}, {r.load}: {r.figure}  [dim]({r.provenance})[/]")


def _sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    console = make_console()
    if args.list:
        _list(console)
        return 0
    try:
        study, refs, words, time_scale = _validate(args)
    except UsageError as e:
        _err(str(e))
        return 2
    output: Path = args.output or Path("out") / "studies" / study.name
    skipped = [t for t in study.targets if words is not None and t not in words]
    legs_skipped = [leg.label for leg in study.legs if leg.target in skipped]
    try:
        datasets = {leg.dataset: load_dataset(leg.dataset, seed=args.seed) for leg in study.legs}
    except DatasetError as e:
        _err(str(e))
        return 2
    _header(console, study, args, words, time_scale, output, skipped)
    out = OutputDir(output)
    summary = Summary()
    errors: list[str] = []
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _sigterm)
    urls: dict[str, str] = {}
    try:
        with ProcessGroup(output / "logs") as children:
            gateway_url = args.gateway_url
            if words is None:
                console.print(
                    f"starting twins: {', '.join(t for t in study.targets if t != 'gateway')}"
                    + (" and a gateway over them" if "gateway" in study.targets else "")
                    + (f" (time scale {time_scale:g})" if time_scale != 1.0 else "")
                )
                topo = start_topology(
                    children,
                    study.targets,
                    time_scale=time_scale,
                    seed=args.seed,
                    policy=args.policy,
                    config_dir=output,
                )
                words = dict(topo.urls)
                urls = dict(topo.urls)
                gateway_url = topo.gateway_url or gateway_url
            errors = _run_loop(_legs(study, args, words, datasets, time_scale, gateway_url, summary, out, console))
            dead = children.check_alive()
            if dead:
                errors.append(f"child server(s) exited during the study: {', '.join(dead)} (logs in {output / 'logs'})")
    except KeyboardInterrupt:
        interrupted = True
        _err("interrupted; writing what was measured")
    except ProcessError as e:
        _err(str(e))
        errors.append(str(e))
    finally:
        signal.signal(signal.SIGTERM, previous)
    rows = checks.evaluate(study, summary, refs, quick=args.quick, skipped=legs_skipped, tolerance_pct=args.tolerance)
    _report(console, study, summary, rows, args, time_scale, interrupted)
    gw_rows = checks.gateway_vs_best(summary) if study.gateway_vs_best else []
    if gw_rows:
        checks.render_gateway(gw_rows, console)
    _write_study(out, study, args, time_scale, words, urls, refs, rows, gw_rows, summary, errors, interrupted)
    if args.plots and any(r.levels for r in summary.runs):
        _plots(summary, output, rows)
    for message in errors:
        _err(message)
    missed = checks.failed(rows)
    if interrupted:
        return 130
    if missed or errors:
        off = [r for r in missed if r.status == "fail"]
        unmeasured = [r for r in missed if r.status != "fail"]
        parts = []
        if off:
            parts.append(
                f"{len(off)} figure(s) off by more than {args.tolerance:g}%: " + ", ".join(_row_name(r) for r in off)
            )
        if unmeasured:
            parts.append(f"{len(unmeasured)} figure(s) not measured")
        if errors and not parts:
            parts.append("a target or child server failed")
        console.print(f"[red]study {study.name}: FAILED[/] ({'; '.join(parts)})")
        return 1
    console.print(
        f"[green]study {study.name}: passed[/] ({len(rows)} figures within {args.tolerance:g}%); outputs in {output}"
    )
    return 0


def _row_name(r: checks.Row) -> str:
    return r.key + (f" C={r.concurrency}" if r.concurrency else "")


def _validate(args: argparse.Namespace) -> tuple[Study, dict[str, Reference], dict[str, str] | None, float]:
    if not args.name:
        raise UsageError(f"which study? one of {', '.join(STUDIES)} (or --list)")
    study = STUDIES.get(args.name)
    if study is None:
        raise UsageError(f"unknown study {args.name!r} (expected one of {', '.join(STUDIES)})")
    refs = apply_overrides(REFERENCES, args.reference)
    if args.tolerance < 0:
        raise UsageError("--tolerance must be >= 0")
    if args.time_scale is not None and not args.time_scale > 0:
        raise UsageError("--time-scale must be > 0")
    words = None
    if args.target:
        if args.time_scale is not None:
            raise UsageError("--time-scale applies to the twins a study starts, not to --target servers")
        if args.policy:
            raise UsageError("--policy applies to the gateway a study starts, not to --target")
        words = target_words(study, args.target)
        if not words:
            raise UsageError("--target is empty")
    time_scale = (
        1.0
        if words is not None
        else (args.time_scale if args.time_scale is not None else (QUICK_TIME_SCALE if args.quick else 1.0))
    )
    return study, refs, words, time_scale


def _header(
    console: Console,
    study: Study,
    args: argparse.Namespace,
    words: dict[str, str] | None,
    time_scale: float,
    output: Path,
    skipped: list[str],
) -> None:
    console.print(f"[bold]study {study.name}[/]: {study.title}")
    if words is None:
        console.print(
            "targets: twins started by this study"
            + (
                f", time scale {time_scale:g} (durations / {time_scale:g}, rates x "
                f"{time_scale:g}: figures in simulated time)"
                if time_scale != 1.0
                else ", real timing"
            )
        )
    else:
        console.print("targets: " + ", ".join(f"{k}={v}" for k, v in words.items()))
        if skipped:
            console.print(f"[yellow]not given, skipped: {', '.join(skipped)}[/]")
    if args.quick:
        console.print("[yellow]--quick: fewer prompts/levels; a smoke test, not a measurement[/]")
    console.print(f"output: {output}")


def _run_loop(coro) -> list[str]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_interruptible(coro))
    return uvloop.run(_interruptible(coro))


async def _interruptible(coro):
    """SIGTERM, while the loop runs, cancels the run from inside the loop and surfaces as
    KeyboardInterrupt. (The synchronous handler raising KeyboardInterrupt at an arbitrary point
    can land in a transport callback, where asyncio logs "Fatal error on transport" and the
    study did not always end as interrupted.)"""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_term() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _legs(
    study: Study,
    args: argparse.Namespace,
    words: dict[str, str],
    datasets: dict,
    time_scale: float,
    gateway_url: str,
    summary: Summary,
    out: OutputDir,
    console: Console,
) -> list[str]:
    errors: list[str] = []
    for leg in study.legs:
        word = words.get(leg.target)
        if word is None:
            continue
        levels = [LevelSpec(concurrency=c, num_prompts=leg.num_prompts(c, args.quick)) for c in leg.levels(args.quick)]
        plan = Plan(
            targets=[word],
            gateway_url=gateway_url,
            model=None,
            dataset=datasets[leg.dataset],
            levels=levels,
            opts=RequestOptions(max_tokens=leg.max_tokens, api_key=args.api_key, timeout=args.timeout),
            seed=args.seed,
            progress=args.progress,
            labels={word: leg.label},
            time_scale=time_scale,
        )
        console.print(
            f"[bold]{leg.label}[/] ({leg.dataset}): C={','.join(map(str, leg.levels(args.quick)))}, "
            f"{'/'.join(str(lv.num_prompts) for lv in levels)} requests, "
            f"max_tokens {leg.max_tokens}"
        )
        _, errs = await execute(plan, console, summary=summary, out=out)
        errors.extend(errs)
    return errors


def _report(
    console: Console,
    study: Study,
    summary: Summary,
    rows: list[checks.Row],
    args: argparse.Namespace,
    time_scale: float,
    interrupted: bool,
) -> None:
    if any(r.levels for r in summary.runs):
        console.print()
        print_table(
            summary,
            console,
            title=f"{study.name} results"
            + (f" (simulated time, twins at {time_scale:g}x)" if time_scale != 1.0 else ""),
        )
    if rows:
        checks.render(
            rows,
            console,
            tolerance_pct=args.tolerance,
            title=f"{study.name}: measured vs reference" + (" (partial: interrupted)" if interrupted else ""),
        )
    spec = checks.acceptance(summary)
    if spec:
        console.print(
            "accept length (tokens per verify step): "
            + "; ".join(
                f"{t} " + ", ".join(f"C={c} {v['accept_length']:.2f}" for c, v in lv.items()) for t, lv in spec.items()
            )
        )


def _write_study(
    out: OutputDir,
    study: Study,
    args: argparse.Namespace,
    time_scale: float,
    words: dict[str, str] | None,
    urls: dict[str, str],
    refs: Mapping[str, Reference],
    rows: list[checks.Row],
    gw_rows: list[checks.GatewayRow],
    summary: Summary,
    errors: list[str],
    interrupted: bool,
) -> None:
    data = {
        "study": study.name,
        "title": study.title,
        "passed": not interrupted and not errors and not checks.failed(rows),
        "tolerance_pct": args.tolerance,
        "time_scale": time_scale,
        "time_scale_note": "twins ran time_scale x real time; durations were divided and "
        "rates multiplied by it (simulated time)"
        if time_scale != 1.0
        else None,
        "quick": args.quick,
        "interrupted": interrupted,
        "targets": {
            t: {
                "url": urls.get(t) or _run_url(summary, study, t),
                "source": "twin" if urls else "given",
                "given_as": None if urls else (words or {}).get(t),
            }
            for t in study.targets
        },
        "rows": rows,
        "references": {k: refs[k] for k in sorted({c.ref for c in study.checks})},
        "acceptance": checks.acceptance(summary),
        "gateway_vs_best": gw_rows,
        "errors": errors,
    }
    out.write_json("study.json", data)


def _run_url(summary: Summary, study: Study, target: str) -> str | None:
    labels = {leg.label for leg in study.legs if leg.target == target}
    return next((r.url for r in summary.runs if r.target in labels and r.url), None)


def _plots(summary: Summary, output: Path, rows: list[checks.Row]) -> None:
    try:
        from loadgen.plots import write_plots
    except ImportError as e:
        print(f"loadgen: plots skipped ({e})", file=sys.stderr)
        return
    refs: dict[str, list[tuple[int, float, str]]] = {}
    for r in rows:  # value references of plotted figures, drawn as crosses
        if isinstance(r.reference, float) and r.concurrency and r.status != "skipped":
            refs.setdefault(r.metric, []).append((r.concurrency, r.reference, f"{r.key} reference ({r.target})"))
    write_plots(summary, output, refs)
