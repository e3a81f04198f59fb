"""The twin's HTTP server: an aiohttp app over one engine driven by the wall-clock runtime."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from twin import info_api, lora_api, native_api, openai_api, responses_api
from twin.engine import Engine
from twin.errors import ApiError, flat_error, native_error, responses_error
from twin.options import ServerOptions
from twin.profile import Profile
from twin.runtime import Runtime
from twin.state import STATE_KEY, SimState

__all__ = ["build_app", "serve"]

log = logging.getLogger("twin")

_SHUTDOWN_GRACE_S = 1.0  # in-flight requests are aborted at shutdown; this bounds the rest
KEEP_ALIVE_ENV, KEEP_ALIVE_DEFAULT_S = "SGLANG_TIMEOUT_KEEP_ALIVE", 5


def keep_alive_s() -> int:
    """How long an idle connection stays open, as SGLang sets uvicorn's `timeout_keep_alive`
    (`entrypoints/http_server.py`) from SGLANG_TIMEOUT_KEEP_ALIVE, an integer, default 5
    (`environ.py`). A client that keeps connections longer meets closed ones."""
    raw = os.environ.get(KEEP_ALIVE_ENV)
    if raw is None:
        return KEEP_ALIVE_DEFAULT_S
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"specroute sim: {KEEP_ALIVE_ENV}: {raw!r} is not a valid integer value") from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses"})


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """No traceback ever reaches a client; generation routes are 503 until ready."""
    state = request.app[STATE_KEY]
    responses = request.path.startswith("/v1/responses")
    if request.path in _GENERATION_PATHS and not state.ready:
        err = ApiError("The server is not ready yet.", status=503)
        if responses:
            return responses_error(ApiError(err.message, status=503, err_type="Service Unavailable"))
        return native_error(err) if request.path == "/generate" else flat_error(err)
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as e:
        # The router's own 404 and 405 are starlette's HTTPException, which SGLang's handler (for
        # fastapi's subclass, `http_server.py`) does not catch: FastAPI's default `{"detail"}`, under
        # /v1/responses too.
        if e.status == 404:
            return web.Response(status=404, body=b'{"detail":"Not Found"}', content_type="application/json")
        if e.status == 405:
            return web.Response(status=405, body=b'{"detail":"Method Not Allowed"}', content_type="application/json")
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.exception("unhandled error on %s", request.path)
        return flat_error(ApiError(f"internal error: {type(e).__name__}", status=500))


def build_app(profile: Profile, options: ServerOptions) -> web.Application:
    """The aiohttp application; the step loop starts with the app and stops with it."""
    engine = Engine(
        profile,
        seed=options.seed,
        max_running=options.max_running_requests,
        max_queued=options.max_queued_requests,
        priority=options.priority,
    )
    runtime = Runtime(engine, options.time_scale)
    state = SimState(profile, options, runtime)
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = state
    app.add_routes(openai_api.routes())
    app.add_routes(responses_api.routes())
    app.add_routes(info_api.routes())
    app.add_routes(native_api.routes())
    app.add_routes(lora_api.routes())

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        runtime.start()
        state.faults.install()
        delay = options.faults.slow_ready_s
        ready_task = (
            asyncio.get_running_loop().call_later(delay, lambda: setattr(state, "ready", True)) if delay > 0 else None
        )
        if ready_task is None:
            state.ready = True
        yield
        if ready_task is not None:
            ready_task.cancel()
        state.faults.uninstall()
        await runtime.stop()

    async def abort_in_flight(app: web.Application) -> None:
        # On SIGTERM, end every open stream cleanly (finish_reason "abort") instead of letting
        # the server wait for generations that may take minutes, or forever under a hang fault.
        for rid in runtime.in_flight():
            runtime.abort(rid)

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(abort_in_flight)
    return app


async def _run(app: web.Application, host: str, port: int) -> int:
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=_SHUTDOWN_GRACE_S,
        keepalive_timeout=keep_alive_s(),
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        print(f"specroute sim: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        return 1
    state = app[STATE_KEY]
    print(
        f"specroute sim: profile {state.profile.name} serving {state.served_model_name} on http://{host}:{port}",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


def serve(profile: Profile, options: ServerOptions) -> int:
    """Run the twin until SIGTERM/SIGINT; returns the process exit code."""
    app = build_app(profile, options)
    return asyncio.run(_run(app, options.host, options.port))
