"""`specroute-gateway serve --config FILE`: run the gateway (uvicorn, uvloop, httptools) on a config."""

from __future__ import annotations

import gc
import logging
import math
import socket
import sys

import uvicorn

from gateway.app import create_app, serving_asgi
from gateway.config import Config, load_config, parse_listen
from gateway.connections import LimitedProtocol
from gateway.runtime import Runtime

__all__ = ["run_config", "serve"]


def serve(config_path: str, listen: str | None = None) -> int:
    """Load the config file and serve it until SIGTERM/SIGINT; a reload re-reads the same file."""
    if listen:
        parse_listen(listen, "--listen")  # before anything starts; the error names the flag
    return run_config(load_config(config_path), listen=listen, config_path=config_path)


def run_config(config: Config, *, listen: str | None = None, config_path: str | None = None) -> int:
    """Serve a config built by the caller (`specroute serve --twins` builds one over the twins it
    started); `listen` overrides its gateway.listen. Returns when the server has stopped."""
    if listen:
        config.gateway.listen = listen
    logging.basicConfig(
        level=getattr(logging, config.logging.level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    host, port = parse_listen(config.gateway.listen)
    run(config, host, port, config_path)
    return 0


def run(config: Config, host: str, port: int, config_path: str | None = None) -> None:
    app = create_app(config, config_path=config_path)
    runtime: Runtime = app.state.runtime
    tune_gc()
    grace_s = config.gateway.shutdown_grace_s
    server = GatewayServer(
        runtime,
        grace_s,
        uvicorn.Config(
            # httptools, with the connections' limits (gateway/connections.py)
            serving_asgi(app),
            host=host,
            port=port,
            loop="uvloop",
            http=LimitedProtocol.limited_by(runtime.connection_limits),
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            backlog=2048,
            # The gateway ends what is still open at grace_s (GatewayServer); uvicorn's own cut, which
            # drops connections mid-answer, only after the second that takes. It takes whole seconds.
            timeout_graceful_shutdown=math.ceil(grace_s) + 1,
        ),
    )
    print(
        f"specroute gateway on http://{host}:{port} "
        f"({len(config.backends)} backends, models: {sorted({b.model for b in config.backends})})",
        file=sys.stderr,
        flush=True,
    )
    server.run()


class GatewayServer(uvicorn.Server):
    """uvicorn's server, telling the gateway when a shutdown (SIGTERM, SIGINT) begins.

    uvicorn then stops accepting and waits for the responses under way. Those still open after
    `grace_s` the gateway ends itself (`Runtime.begin_shutdown`): each upstream request is closed, so
    SGLang aborts it, and each client gets a 503 or, mid-stream, an error event, where uvicorn's own
    timeout would cancel the handlers and drop the connections."""

    def __init__(self, runtime: Runtime, grace_s: float, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.runtime.begin_shutdown(self.grace_s)
        await super().shutdown(sockets)


# Cyclic GC: requests free their objects by reference counting; what the collector kept doing was
# walking the long-lived objects of the app and its libraries, a CPU cost and a pause at the tail of
# latency (docs/performance.md, Memory and processes).
GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    """Freeze what start-up allocated (never scanned again) and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
