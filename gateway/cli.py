"""The gateway's own command line: `specroute-gateway serve --config FILE [--listen HOST:PORT]`
(also `python -m gateway serve ...`).

This is all the product runs by itself. The `specroute` command (tools/cli.py) adds the tooling's
commands and `serve --twins` (simulated backends it starts itself), and hands `serve --config` here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from common.version import package_version
from gateway.config import ConfigError

__all__ = ["NO_BACKENDS", "guarded", "main"]

# What `serve` says when it is given no backends: the two ways on.
NO_BACKENDS = (
    "no backends given: pass --config FILE (a gateway config; `specroute config init` writes one), "
    "or --twins for the embedded simulated backends (`specroute serve --twins`)"
)


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Speculative-decoding-aware LLM gateway for SGLang servers.")
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gateway on a config file")
    s.add_argument("--config", help="TOML config file (docs/configuration.md)")
    s.add_argument("--listen", help="HOST:PORT (default: the config's gateway.listen, 127.0.0.1:8000)")
    return p


def guarded(prog: str, run: Callable[[], int]) -> int:
    """Run a command; a bad config is one line and exit code 2, a failure to start one line and 1."""
    try:
        return run()
    except ConfigError as e:
        print(f"{prog}: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None, prog: str = "specroute-gateway") -> int:
    args = _parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    config: str | None = args.config
    if config is None:
        print(f"{prog} serve: {NO_BACKENDS}", file=sys.stderr)
        return 2

    def run() -> int:
        from gateway.serve import serve  # uvicorn and the app: only once there is something to serve

        return serve(config, args.listen)

    return guarded(prog, run)


if __name__ == "__main__":
    sys.exit(main())
