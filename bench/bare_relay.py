"""The stack's floor: the least a relay built on the gateway's own stack can cost.

    python -m bench.bare_relay PORT BACKEND_PORT [uvicorn|granian]

An ASGI app under `specroute serve`'s server settings (uvicorn, uvloop, httptools, the same GC
tuning) that forwards each POST to the backend with one shared aiohttp session and relays the
answer: a stream chunk by chunk as `readany()` returns it, anything else whole. No gateway logic at
all: no auth, parsing, routing, telemetry, metrics or log. `bench.gateway_bench` measures it next
to the gateway, so the gateway's CPU per request and per relayed chunk can be read against what
the stack itself costs on the same machine in the same run. With `granian` it runs under granian's
embedded server instead, as `bench.asgi_servers` runs the gateway (`gateway_bench --server granian`).
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
import uvicorn

from gateway.serve import tune_gc


def make_app(backend_port: int) -> Any:
    base = f"http://127.0.0.1:{backend_port}"
    session: aiohttp.ClientSession | None = None

    async def app(scope: dict, receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    if session is not None:
                        await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["method"] != "POST":  # readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if session is None:  # made on first use: granian's embedded server sends no lifespan events
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async with session.post(base + scope["path"], data=body, headers={"content-type": "application/json"}) as resp:
            headers = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            if resp.content_type != "text/event-stream":
                await send({"type": "http.response.body", "body": await resp.read()})
                return
            read = resp.content.readany
            while chunk := await read():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def _granian(app: Any, port: int) -> None:
    import uvloop
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    async def main() -> None:
        server = Server(
            app,
            address="127.0.0.1",
            port=port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            websockets=False,
            backlog=2048,
            runtime_threads=1,
            log_enabled=False,
        )
        await server.serve()

    uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or (len(args) == 3 and args[2] not in ("uvicorn", "granian", "default")):
        print(__doc__, file=sys.stderr)
        return 2
    app = make_app(int(args[1]))
    tune_gc()
    if len(args) == 3 and args[2] == "granian":
        _granian(app, int(args[0]))
    else:
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=int(args[0]),
            loop="uvloop",
            http="httptools",  # as `specroute serve` runs (without its connection limits)
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
