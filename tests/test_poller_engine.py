"""The poller's engine check (SGLang's /health_generate) against servers that answer it in each
way SGLang can, and in ways it does not: only its own 503, or no answer, take a backend out."""

from __future__ import annotations

import asyncio

from aiohttp import web

from backends import BackendSpec, Strategy
from backends.client import SGLangClient
from gateway.poller import BackendPoller
from gateway.pool import Backend


async def _engine_check_with(status: int) -> tuple[bool, bool, bool]:
    """A backend whose /health_generate answers `status`: (ready, engine_ok) after one check, and
    whether a second check asked the server again."""
    asked = 0

    async def health_generate(_: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        return web.Response(status=status)

    app = web.Application()
    app.router.add_get("/health_generate", health_generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    spec = BackendSpec(name="a", url=f"http://127.0.0.1:{port}", model="m", strategy=Strategy.DFLASH)
    backend = Backend(spec, SGLangClient(spec))
    poller = BackendPoller(backend, engine_check_s=10.0)
    try:
        await poller.check_engine()
        ready, ok = backend.ready, poller.engine_ok
        await poller.check_engine()
        return ready, ok, asked == 2
    finally:
        await backend.client.close()
        await runner.cleanup()


def test_sglangs_own_failure_takes_the_backend_out():
    assert asyncio.run(_engine_check_with(503)) == (False, False, True)


def test_a_pass_keeps_it_in():
    assert asyncio.run(_engine_check_with(200)) == (True, True, True)


def test_an_answer_sglang_never_gives_is_no_verdict_and_ends_the_checks():
    for status in (404, 401, 500):  # an older server, a proxy wanting other credentials, a broken route
        assert asyncio.run(_engine_check_with(status)) == (True, True, False), status
