"""`specroute serve`: run the gateway (uvicorn, uvloop, httptools), with the embedded twins if no config."""

from __future__ import annotations

import gc
import logging
import math
import sys

import uvicorn

from backends.procs import ProcessGroup, start_twins
from gateway.app import create_asgi
from gateway.config import Config, load_config, parse_listen
from gateway.head_write import HeadHoldingProtocol
from gateway.topology import SEED_SYSTEMS, embedded_config


def serve(config_path: str | None, listen: str | None, sim_time_scale: float | None = None) -> int:
    with ProcessGroup() as twins:
        if config_path:
            config = load_config(config_path)
        else:
            # The embedded default: one twin per seed system, stopped when the gateway stops.
            ports = start_twins(twins, [s.name for s in SEED_SYSTEMS], time_scale=sim_time_scale)
            config = embedded_config(ports, listen or "127.0.0.1:8000")
            for s in SEED_SYSTEMS:
                print(
                    f"twin {s.name:<20} {s.model:<12} {s.strategy:<7} http://127.0.0.1:{ports[s.name]}", file=sys.stderr
                )
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
    app = create_asgi(config, config_path=config_path)
    tune_gc()
    server = uvicorn.Server(
        uvicorn.Config(
            # httptools, with a response's head and body leaving in one write (gateway/head_write.py)
            app,
            host=host,
            port=port,
            loop="uvloop",
            http=HeadHoldingProtocol,
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            backlog=2048,
            # SIGTERM: stop accepting, let in-flight streams finish for up to this long
            timeout_graceful_shutdown=math.ceil(config.gateway.shutdown_grace_s),  # uvicorn takes whole seconds
        )
    )
    print(
        f"specroute gateway on http://{host}:{port} "
        f"({len(config.backends)} backends, models: {sorted({b.model for b in config.backends})})",
        file=sys.stderr,
        flush=True,
    )
    server.run()


# Cyclic GC: the collector's own cost, not the requests', was ~15% of the gateway's CPU. Requests free
# their objects by reference counting; what the collector kept doing was walking the ~70k long-lived
# objects of the app and its libraries (a full pass takes ~16 ms, a pause at the tail of latency).
GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    """Freeze what start-up allocated (never scanned again) and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
