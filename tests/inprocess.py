"""Run the gateway in this process (uvicorn in a thread), to inspect spans with an in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from gateway.app import create_asgi
from gateway.config import Config
from tools.processes import free_port, wait_ready


@contextlib.contextmanager
def serve_in_thread(config: Config, root_path: str = "", **kwargs: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_asgi(config, **kwargs),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
            root_path=root_path,
        )
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
