"""The gateway app under different ASGI servers, for the server comparison of the benchmark.

    python -m bench.asgi_servers uvicorn|granian CONFIG

`uvicorn` is what `specroute serve` runs (uvloop + httptools). `granian` runs the same ASGI app
(`gateway.app.create_asgi`, GC tuned the same way) in granian's embedded server on a uvloop loop,
one worker, one Rust runtime thread. Used by `python -m bench.gateway_bench --server granian`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from gateway.app import create_asgi
from gateway.config import load_config, parse_listen
from gateway.serve import tune_gc


def _uvicorn(config_path: str) -> None:
    from gateway.serve import run

    config = load_config(config_path)
    host, port = parse_listen(config.gateway.listen)
    run(config, host, port, config_path)


def _granian(config_path: str) -> None:
    import uvloop
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    config = load_config(config_path)
    host, port = parse_listen(config.gateway.listen)
    app = create_asgi(config, config_path=config_path)
    tune_gc()  # as `specroute serve` does, so the comparison is of the servers only

    async def main() -> None:
        server = Server(
            app,
            address=host,
            port=port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            websockets=False,
            backlog=2048,
            runtime_threads=1,
            log_enabled=False,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        print(f"specroute gateway (granian) on http://{host}:{port}", file=sys.stderr, flush=True)
        await server.serve()

    uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("uvicorn", "granian"):
        print(__doc__, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    (_uvicorn if args[0] == "uvicorn" else _granian)(args[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
