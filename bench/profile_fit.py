"""`make bench-profile`: how long `specroute profile` takes and how well its fit predicts, on twins.

For each truth named (a bundled profile, or with `--perturb` a bundled profile with its
parameters moved 20-30%, `bench/perturbed_profile.py`), a twin at `--time-scale` (1: the
hardware's own speed, the issue's condition for the duration target) is swept (`--quick` and,
with `--full`, the full sweep), and the fitted profile's predictions at the held-out points (C =
3, 12, 24; prompts 4096 and 16384; T = 0.6) are compared with the truth's own on the virtual clock
(the fit's error and nothing else) and, unless `--no-http`, with the same twin measured over HTTP
(`specroute profile validate`: what the HTTP path and a busy machine add).

    python -m bench.profile_fit [--profiles k26-ar,k26-dflash,...] [--perturb k26-dflash] [--time-scale 1]
                                [--full | --full-only] [--no-http] [--output DIR]

Writes the fitted profiles as DIR/MODE/NAME.toml (`bench.profile_plan` plans on them) and the
perturbed truths as DIR/truths/NAME.toml. Prints the sweeps' wall-clock durations and each
point's errors; checks the targets (quick under 5 minutes at time scale 1, every held-out error
within 10%) and exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from bench.perturbed_profile import write_perturbed
from tools.fit.measurements import load_measurements
from tools.fit.sweep import describe_times, server_busy_s
from tools.fit.validate import PointResult, measure_point, points_of, predict_point, render
from tools.processes import ProcessGroup, free_port, specroute_cmd
from twin.profile import load_profile

TRUTHS = ("k26-ar", "k26-dflash", "k26-ddtree", "k26-eagle3", "k26-ngram", "qwen36-ar", "qwen36-ddtree-b15")
QUICK_LIMIT_S = 300.0
TARGET = 0.10


class Row(msgspec.Struct, kw_only=True):
    profile: str
    mode: str
    sweep_s: float
    rounds: str = ""  # the sweep's wall-clock time by kind of round
    server_s: float | None = None  # what the server computed of it (the sweep's time on an idle machine)
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load average as the sweep began, ended
    http: list[PointResult] = []
    virtual: list[PointResult] = []

    @property
    def worst_http(self) -> float:
        return max((max(abs(r.tok_s_error), abs(r.ttft_error)) for r in self.http), default=0.0)

    @property
    def worst_virtual(self) -> float:
        return max((max(abs(r.tok_s_error), abs(r.ttft_error)) for r in self.virtual), default=0.0)


def _run(profile: str, spec: str, mode: str, scale: float, out: Path, http: bool) -> Row:
    """Sweep a twin of `spec` (a bundled name or a profile file), fit, and compare at the held-out points."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (out / mode).mkdir(exist_ok=True)
    fitted = out / mode / f"{profile}.toml"
    truth = load_profile(spec)
    # started as docs/your-model.md tells a user to start a thinking model: behind its reasoning parser
    parser = ["--reasoning-parser", truth.reasoning.parser] if truth.reasoning is not None else []
    with ProcessGroup(log_dir=out / "logs") as group:
        cmd = specroute_cmd("sim", "--profile", spec, "--port", str(port), "--time-scale", str(scale), *parser)
        group.start(profile, cmd)
        group.wait_ready({profile: f"{url}/ready"})
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        args = ["profile", url, "-o", str(fitted), "--force", *(["--quick"] if mode == "quick" else [])]
        res = subprocess.run(specroute_cmd(*args), capture_output=True, text=True)
        sweep_s = time.perf_counter() - t0
        (out / "logs" / f"{profile}-{mode}.profile.log").write_text(res.stdout + res.stderr)
        if res.returncode != 0:
            raise RuntimeError(f"{profile} {mode}: specroute profile failed:\n{res.stderr[-2000:]}")
        fit = load_profile(str(fitted))
        measured = load_measurements(fitted.with_suffix(".measurements.json"))
        row = Row(profile=profile, mode=mode, sweep_s=sweep_s, rounds=describe_times(measured.levels))
        row.load = (load_before, os.getloadavg()[0])
        row.server_s = server_busy_s(measured.levels)
        for point in points_of([3, 12, 24], [4096, 16384], 0.6, 256, 0):
            predicted = predict_point(fit, point)
            row.virtual.append(PointResult(point=point, truth=predict_point(truth, point), predicted=predicted))
            if http:
                row.http.append(PointResult(point=point, truth=measure_point(url, point), predicted=predicted))
                print(f"  {profile} {mode}: C={point.concurrency} P={point.prompt_tokens} measured", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default=",".join(TRUTHS))
    ap.add_argument(
        "--perturb", default="k26-dflash", help="bundled profiles whose perturbed copies are truths too ('' for none)"
    )
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--full", action="store_true", help="also run the full sweep of each profile")
    ap.add_argument("--full-only", action="store_true", help="run the full sweep only")
    ap.add_argument("--no-http", action="store_true", help="compare on the virtual clock only")
    ap.add_argument("--output", type=Path, default=Path("out/bench-profile"))
    args = ap.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    truths = {p: p for p in args.profiles.split(",") if p}
    for name in [p for p in args.perturb.split(",") if p]:
        (args.output / "truths").mkdir(exist_ok=True)
        path = write_perturbed(name, args.output / "truths")
        truths[path.stem] = str(path)
    rows: list[Row] = []
    for profile, spec in truths.items():
        for mode in ("full",) if args.full_only else ("quick", "full") if args.full else ("quick",):
            print(f"{profile}: {mode} sweep at time scale {args.time_scale:g} ...", flush=True)
            row = _run(profile, spec, mode, args.time_scale, args.output, not args.no_http)
            rows.append(row)
            load = f"load {row.load[0]:.1f}-{row.load[1]:.1f}"
            server = f", the server computed {row.server_s:.0f} s" if row.server_s is not None else ""
            print(f"{profile} {mode}: sweep {row.sweep_s:.0f} s ({load}{server}): {row.rounds}")
            if row.http:
                sys.stdout.write(render(row.http, "server"))
            sys.stdout.write(render(row.virtual, "profile"))
    (args.output / "results.json").write_bytes(msgspec.json.format(msgspec.json.encode(rows), indent=1) + b"\n")
    print(
        "\n| profile | sweep | wall s | server s | load | worst error vs the twin over HTTP "
        "| vs its profile (virtual clock) |"
    )
    print("|---|---|---:|---:|---|---:|---:|")
    for r in rows:
        http = f"{100 * r.worst_http:.1f}%" if r.http else "-"
        load = f"{r.load[0]:.1f}-{r.load[1]:.1f}"
        server = f"{r.server_s:.0f}" if r.server_s is not None else "-"
        row_text = (
            f"| {r.profile} | {r.mode} | {r.sweep_s:.0f} | {server} | {load} | {http} | {100 * r.worst_virtual:.1f}% |"
        )
        print(row_text)
    failed = []
    if args.time_scale == 1.0:
        failed += [
            f"{r.profile} quick took {r.sweep_s:.0f} s" for r in rows if r.mode == "quick" and r.sweep_s > QUICK_LIMIT_S
        ]
    failed += [f"{r.profile} {r.mode}: {100 * r.worst_http:.1f}% over HTTP" for r in rows if r.worst_http > TARGET]
    failed += [
        f"{r.profile} {r.mode}: {100 * r.worst_virtual:.1f}% on the virtual clock"
        for r in rows
        if r.worst_virtual > TARGET
    ]
    print("targets: " + ("all met" if not failed else "MISSED: " + "; ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
