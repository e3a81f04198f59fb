"""`specroute profile`: measure a live SGLang server and fit a twin profile from it.

    specroute profile URL -o FILE [--quick] [--max-prompt-tokens N] [--name NAME]
                      [--measurements PATH] [--api-key-env VAR] [--force]
    specroute profile fit MEASUREMENTS.json -o FILE [--name NAME] [--force]
    specroute profile validate FILE URL [--concurrency 3,12,24] [--prompt-tokens 4096,16384]
                      [--temperature 0.6] [--max-tokens N] [--api-key-env VAR]

The sweep (`tools.fit.sweep`) keeps its measurements in MEASUREMENTS (default FILE with
`.measurements.json`) after every round; `fit` fits a kept file again. The profile is written
only when every part it needs was fitted, and loaded back as the twin loads it before it is kept.
`validate` measures the server at load points a sweep does not use and compares them with what
the profile predicts on the virtual clock.

Exit status: 0 done; 1 the sweep stopped or the fit is incomplete (the measurements are kept);
2 bad input, or a server that cannot be profiled (unreachable, busy), before anything was sent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from tools.cli_usage import UsageError, UsageParser, api_key_from_env
from tools.fit.fitted import FitResult, fit_all
from tools.fit.measurements import Measurements, load_measurements
from tools.fit.render import render_profile
from tools.fit.report import render_report
from tools.fit.schema import profile_document

__all__ = ["main", "write_profile"]

PROG = "specroute profile"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def _sweep_parser() -> UsageParser:
    p = UsageParser(prog=PROG, description="Measure a live, otherwise idle SGLang server and fit a twin profile.")
    p.add_argument("url", help="the server's base URL, e.g. http://gpu-a:30000")
    p.add_argument("--output", "-o", required=True, help="the profile to write (.toml)")
    p.add_argument(
        "--quick", action="store_true", help="fewer, shorter rounds (3-4.5 minutes on a K2.6 twin at time scale 1)"
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=_positive_int,
        help="the longest prompt measured (default 32768 quick, 65536 full; at most the context length)",
    )
    p.add_argument("--name", help="the profile's name (default: the output file's name without .toml)")
    p.add_argument("--measurements", help="where the raw measurements go (default: FILE.measurements.json)")
    p.add_argument("--api-key-env", metavar="VAR", help="send the key in this environment variable (SGLang --api-key)")
    p.add_argument("--force", action="store_true", help="overwrite the profile if it exists")
    return p


def _fit_parser() -> UsageParser:
    p = UsageParser(prog=f"{PROG} fit", description="Fit a twin profile from a sweep's kept measurements.")
    p.add_argument("measurements", help="a measurements file of `specroute profile`")
    p.add_argument("--output", "-o", required=True, help="the profile to write (.toml)")
    p.add_argument("--name", help="the profile's name (default: the output file's name without .toml)")
    p.add_argument("--force", action="store_true", help="overwrite the profile if it exists")
    return p


def _output(path_text: str, force: bool) -> Path:
    path = Path(path_text)
    if path.suffix != ".toml":
        raise UsageError(f"--output {path_text}: a profile file ends in .toml")
    if path.exists() and not force:
        raise UsageError(f"{path} exists (pass --force to overwrite)")
    return path


def write_profile(fit: FitResult, path: Path, name: str) -> str:
    """Write the fit's profile to `path` and load it back as the twin does; the text written."""
    from twin.profile import ProfileError, load_profile

    doc = profile_document(fit, name)
    m = fit.measurements
    header = [
        f"Twin profile fitted by `specroute profile` from {m.url} on {m.date} ({m.mode} sweep, prompts up to "
        f"{m.max_prompt_tokens} tokens).",
        f"{len(m.levels)} rounds measured; `specroute profile fit MEASUREMENTS.json -o FILE` fits them again.",
    ]
    text = render_profile(doc, header)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.part.toml")  # load_profile reads .toml paths
    tmp.write_text(text, encoding="utf-8")
    try:
        load_profile(str(tmp))
    except ProfileError as e:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"the fitted profile does not load as a twin profile: {e}") from None
    tmp.replace(path)
    return text


def _finish(m: Measurements, out: Path, name: str, measurements_path: Path | None) -> int:
    fit = fit_all(m)
    sys.stdout.write(render_report(fit))
    details = out.with_name(out.stem + ".fit.json")
    if not fit.complete:
        print(
            f"{PROG}: the fit is incomplete, no profile written: "
            + "; ".join(f"{k}: {v}" for k, v in fit.unfitted.items() if k in ("step", "prefill", "acceptance")),
            file=sys.stderr,
        )
        if measurements_path is not None:
            print(f"{PROG}: the measurements are kept in {measurements_path}", file=sys.stderr)
        return 1
    try:
        write_profile(fit, out, name)
    except RuntimeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    details.write_bytes(msgspec.json.format(msgspec.json.encode(fit), indent=1) + b"\n")
    print(f"wrote {out} (the fit's points and residuals: {details})")
    return 0


def _sweep_main(argv: list[str]) -> int:
    from tools.fit.sweep import SweepRefused, SweepStopped, sweep

    args = _sweep_parser().parse_args(argv)
    out = _output(args.output, args.force)
    api_key = api_key_from_env(args.api_key_env)
    measurements = Path(args.measurements) if args.measurements else out.with_name(out.stem + ".measurements.json")
    try:
        m = sweep(
            args.url,
            quick=args.quick,
            measurements_path=measurements,
            max_prompt_tokens=args.max_prompt_tokens,
            api_key=api_key,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
    except SweepRefused as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except SweepStopped as e:
        print(f"{PROG}: the sweep stopped: {e}", file=sys.stderr)
        print(
            f"{PROG}: the measurements so far are kept in {measurements}; `{PROG} fit {measurements} -o FILE` fits "
            "what they hold",
            file=sys.stderr,
        )
        return 1
    print(f"sweep: {len(m.levels)} rounds in {m.wall_s:.0f} s", file=sys.stderr)
    return _finish(m, out, args.name or out.stem, measurements)


def _fit_main(argv: list[str]) -> int:
    args = _fit_parser().parse_args(argv)
    out = _output(args.output, args.force)
    try:
        m = load_measurements(Path(args.measurements))
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from None
    if m.stopped:
        print(f"{PROG}: note: this sweep stopped early ({m.stopped}); fitting what it measured", file=sys.stderr)
    return _finish(m, out, args.name or out.stem, None)


def main(argv: list[str]) -> int:
    """Entry point of `specroute profile`; returns the exit code."""
    try:
        if argv and argv[0] == "fit":
            return _fit_main(argv[1:])
        if argv and argv[0] == "validate":
            from tools.fit.validate import main as validate_main

            return validate_main(argv[1:])
        return _sweep_main(argv)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
