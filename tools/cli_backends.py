"""`specroute backends ...`: the real SGLang servers of the studies.

    specroute backends list
    specroute backends show NAME [--explain] [launch options]
    specroute backends launch NAME [launch options]        # GPU host with the [sglang] extra
    specroute backends systemd NAME [--python PATH] [--user U] [launch options]
    specroute backends check URL [--recipe NAME] [--json] [--api-key K] [--max-tokens N]
    specroute backends lint [NAME ...] [--wheel PATH]      # recipe flags vs SGLang's definitions

Launch options: --model-path P, --gpus 0,1,..., --host H, --port P, --otlp-endpoint HOST:PORT,
--no-trace, --ddtree-budget B. Usage errors exit 2 with one line; a failed check or launch exits 1.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from gateway.config import url_problem
from tools.cli_usage import UsageError, UsageParser
from tools.launch.recipe import (
    LaunchOptions,
    LaunchRecipe,
    RecipeError,
    explained,
    list_recipes,
    load_recipe,
    server_argv,
    shell_line,
)

__all__ = ["main"]

PROG = "specroute backends"


def _gpus(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(g) for g in text.split(",") if g.strip() != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices such as 0,1,2,3, got {text!r}") from None
    if not gpus or any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"expected GPU indices such as 0,1,2,3, got {text!r}")
    return gpus


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port 1-65535, got {text!r}")
    return int(text)


def _launch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="launch recipe (see `specroute backends list`) or a .toml path")
    p.add_argument("--model-path", help="target weights (default: the recipe's Hugging Face repo id)")
    p.add_argument("--gpus", type=_gpus, help="GPU indices, e.g. 0,1,2,3,4,5,6,7 (sets CUDA_VISIBLE_DEVICES)")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=_port, default=30000, help="listen port (default 30000)")
    p.add_argument(
        "--otlp-endpoint",
        default="localhost:4317",
        metavar="HOST:PORT",
        help="OTLP/gRPC collector for SGLang's traces (default localhost:4317)",
    )
    p.add_argument("--no-trace", action="store_true", help="leave out --enable-trace and the OTLP endpoint")
    p.add_argument("--ddtree-budget", type=int, metavar="B", help="DDTree recipes: tree node budget")


def _parser() -> UsageParser:
    p = UsageParser(prog=PROG, description="Launch recipes of the studies' SGLang servers, and probes of live ones.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=UsageParser)
    sub.add_parser("list", help="the launch recipes")
    s = sub.add_parser("show", help="print the exact `python -m sglang.launch_server ...` line")
    _launch_options(s)
    s.add_argument("--explain", action="store_true", help="a bash script, one argument per line with its reason")
    s.add_argument("--python", default="python", help="interpreter in the printed line (default python)")
    s = sub.add_parser("launch", help="run the server here (GPU host with the [sglang] extra)")
    _launch_options(s)
    s = sub.add_parser("systemd", help="print a systemd unit for the recipe")
    _launch_options(s)
    s.add_argument(
        "--python",
        default=sys.executable,
        help="absolute path of the Python that has SGLang (default: this interpreter)",
    )
    s.add_argument("--user", default="sglang", help="User= of the unit (default sglang)")
    s.add_argument("--hf-home", help="HF_HOME for the model cache")
    s = sub.add_parser("check", help="probe a live SGLang server and print what the gateway will see")
    s.add_argument("url", type=_base_url, help="base URL, e.g. http://gpu-a:30000")
    s.add_argument("--recipe", help="also compare what it reports with this launch recipe")
    s.add_argument("--api-key", help="the server's --api-key, if any")
    s.add_argument("--max-tokens", type=int, default=32, help="tokens of the test generation (default 32)")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call (default 30)")
    s.add_argument("--json", action="store_true", help="machine-readable report")
    s = sub.add_parser("lint", help="check the recipes' flags against SGLang's own argument definitions")
    s.add_argument("names", nargs="*", help="recipes (default: all)")
    s.add_argument("--wheel", help="an sglang wheel (default: sglang==0.5.23, downloaded once to the cache)")
    return p


def _options(args: argparse.Namespace, python: str = "python") -> LaunchOptions:
    return LaunchOptions(
        model_path=args.model_path,
        host=args.host,
        port=args.port,
        gpus=args.gpus,
        otlp_endpoint=args.otlp_endpoint,
        trace=not args.no_trace,
        ddtree_budget=args.ddtree_budget,
        python=python,
    )


def _list() -> int:
    for prof in list_recipes():
        build = "" if prof.build == "release" else f"  [{prof.build}]"
        print(
            f"{prof.name:<19} {prof.strategy.value:<7} {prof.served_model_name:<12} {prof.gpus} GPU  "
            f"{prof.description}{build}"
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.name)
    options = _options(args, args.python)
    print(explained(recipe, options) if args.explain else shell_line(recipe, options))
    return 0


def _launch(args: argparse.Namespace) -> int:
    from tools.launch.run import LaunchError, launch

    recipe = load_recipe(args.name)
    try:
        launch(recipe, _options(args))
    except LaunchError as e:
        print(f"{PROG} launch: {e}", file=sys.stderr)
        return 1
    return 0  # only reached when exec is replaced (tests)


def _systemd(args: argparse.Namespace) -> int:
    from tools.launch.systemd import unit

    recipe = load_recipe(args.name)
    print(unit(recipe, _options(args, args.python), user=args.user, hf_home=args.hf_home), end="")
    return 0


def _expected(recipe: LaunchRecipe) -> dict[str, object]:
    argv = server_argv(recipe, LaunchOptions(trace=False))
    values: dict[str, str] = {}
    for i, token in enumerate(argv):
        if token.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values[token] = argv[i + 1]
    return {
        "algorithm": values.get("--speculative-algorithm"),
        "served_model_name": recipe.served_model_name,
        "tp_size": int(values["--tp-size"]) if "--tp-size" in values else None,
        "draft_model_path": values.get("--speculative-draft-model-path"),
    }


def _base_url(text: str) -> str:
    """A server's base URL, checked as a config's backend URL is (a traceback from urllib otherwise)."""
    problem = url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _check(args: argparse.Namespace) -> int:
    from tools.launch.probe import probe, render

    recipe = load_recipe(args.recipe) if args.recipe else None
    report = probe(args.url, api_key=args.api_key, max_tokens=args.max_tokens, timeout_s=args.timeout)
    if recipe is not None and report.reachable:
        for key, want in _expected(recipe).items():
            got = getattr(report, key)
            same = (str(got).upper() == str(want).upper()) if key == "algorithm" and got and want else got == want
            if not same:
                report.problems.append(f"{key}: the server reports {got!r}, recipe {recipe.name} launches {want!r}")
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(render(report))
    return 0 if report.ok and not report.problems else 1


def _lint(args: argparse.Namespace) -> int:
    from tools.launch.recipe import command
    from tools.launch.sglang_args import (
        WheelUnavailable,
        check_algorithm_constraints,
        check_argv,
        check_build_constraints,
        ensure_wheel,
        spec_for_build,
        spec_from_wheel,
    )

    try:
        wheel = args.wheel or ensure_wheel()
    except WheelUnavailable as e:
        print(f"{PROG} lint: {e} (pass --wheel PATH)", file=sys.stderr)
        return 1
    release = spec_from_wheel(wheel)
    recipes = [load_recipe(n) for n in args.names] if args.names else list_recipes()
    failed = 0
    for prof in recipes:
        argv = command(prof)
        problems = (
            check_argv(argv, spec_for_build(release, prof.build))
            + check_build_constraints(argv, prof.build)
            + check_algorithm_constraints(argv)
        )
        against = f"sglang {release.version}" + ("" if prof.build == "release" else " + DDTree PR flags")
        print(
            f"{prof.name:<19} {'ok' if not problems else 'FAIL'}  "
            f"({sum(t.startswith('--') for t in argv)} flags vs {against})"
        )
        for problem in problems:
            print(f"    {problem}")
        failed += bool(problems)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    """Entry point of `specroute backends`; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
        return {
            "list": lambda _: _list(),
            "show": _show,
            "launch": _launch,
            "systemd": _systemd,
            "check": _check,
            "lint": _lint,
        }[args.command](args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except RecipeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
