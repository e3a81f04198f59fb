"""`specroute`: the gateway and its tools in one command.

`serve --config FILE` is the product's own command (gateway/cli.py, `specroute-gateway`);
`serve --twins` starts the seed systems as twins and serves a config over them
(tools/topology.py). The other commands are tooling: the twin (`sim`), the evaluator and planner
(`eval`, `plan`), launch recipes and probes (`backends`), configs (`config`) and the demo. Each is
imported only when it runs.
"""

from __future__ import annotations

import argparse
import sys

from common.output_dir import output_dir
from common.version import package_version
from gateway import cli as gateway_cli

# Seconds of traffic per level and target. Aggregate tok/s is tokens over the level's wall time
# (first send to last answer). A level of 2 x C requests is two rounds per client, so its wall time
# is the unluckiest client's two requests: a router that puts a quarter of them on a second, slower
# server adds throughput for as long as the load lasts and still loses that measure to the fastest
# server alone. A level that runs for several rounds measures the throughput users get under that
# load; the drain after the last send (the slowest requests in flight) is then a small part of it.
DEMO_LEVEL_S = 20


def _levels(text: str) -> str:
    """The demo's concurrency levels, checked before it starts anything (loadgen reads them)."""
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specroute", description="Speculative-decoding-aware LLM gateway.")
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gateway on a config file, or over embedded twins (--twins)")
    on = s.add_mutually_exclusive_group()
    on.add_argument("--config", help="TOML config file (docs/configuration.md)")
    on.add_argument("--twins", action="store_true", help="start the seed systems as twins and serve them")
    s.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8000 or the config's gateway.listen)")
    s.add_argument(
        "--sim-time-scale",
        type=float,
        default=None,
        help="--twins only: multiply simulated time (e.g. 0.05 for fast tests)",
    )
    sub.add_parser("sim", help="run one SGLang-compatible twin server (see `specroute sim --help`)", add_help=False)
    sub.add_parser(
        "eval", help="evaluate the policies on the twin's engine, virtual clock (--scenario all)", add_help=False
    )
    sub.add_parser(
        "plan", help="which N servers to run for a traffic: fleet search on the virtual clock", add_help=False
    )
    sub.add_parser(
        "profile", help="measure a live SGLang server and fit a twin profile (profile URL -o FILE)", add_help=False
    )
    sub.add_parser(
        "backends", help="launch recipes of the real SGLang servers: list/show/launch/systemd/check", add_help=False
    )
    sub.add_parser("config", help="write or check a gateway config (config init --from-profiles ...)", add_help=False)
    d = sub.add_parser("demo", help="start twins + gateway, sweep through both, print the table")
    d.add_argument("--concurrency", type=_levels, default="1,4,32", help="closed-loop levels (default 1,4,32)")
    d.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    d.add_argument(
        "--level-seconds",
        type=float,
        default=DEMO_LEVEL_S,
        help=f"seconds of traffic per level and target (default {DEMO_LEVEL_S})",
    )
    d.add_argument("--sim-time-scale", type=float, default=None, help="the twins' time scale (default 1: real time)")
    d.add_argument(
        "--output", type=output_dir, default=None, help="directory for loadgen outputs (default: a temp dir)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":  # the twin owns its own argument parser
        from twin.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "eval":
        if "--http" in argv[1:]:  # the same scenario over real HTTP through gateways, vs the virtual clock
            from evaluate.http_check import main as http_main

            return http_main([a for a in argv[1:] if a != "--http"])
        from evaluate.cli import main as eval_main

        return eval_main(argv[1:])
    if argv and argv[0] == "plan":
        from evaluate.cli_plan import main as plan_main

        return plan_main(argv[1:])
    if argv and argv[0] == "profile":
        from tools.fit.cli import main as profile_main

        return profile_main(argv[1:])
    if argv and argv[0] in ("backends", "config"):
        from tools import cli_backends, cli_config

        command_main = cli_backends.main if argv[0] == "backends" else cli_config.main
        return command_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "demo":
        from tools.demo import demo

        return gateway_cli.guarded(
            "specroute",
            lambda: demo(args.concurrency, args.max_tokens, args.sim_time_scale, args.output, args.level_seconds),
        )
    return 2


def _serve(args: argparse.Namespace) -> int:
    if args.twins:
        from tools.topology import serve_twins

        return gateway_cli.guarded("specroute", lambda: serve_twins(args.listen, args.sim_time_scale))
    if args.sim_time_scale is not None:
        print("specroute serve: --sim-time-scale applies to --twins only", file=sys.stderr)
        return 2
    if args.config is None:
        print(f"specroute serve: {gateway_cli.NO_BACKENDS}", file=sys.stderr)
        return 2
    # the product's own command, as `specroute-gateway serve` runs it
    listen = ["--listen", args.listen] if args.listen else []
    return gateway_cli.main(["serve", "--config", args.config, *listen], prog="specroute")


if __name__ == "__main__":
    sys.exit(main())
