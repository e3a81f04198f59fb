"""The poller against small servers that answer as SGLang can, and in ways it does not: the engine
check (/health_generate), where only SGLang's own 503 or no answer take a backend out; and a
restart between two polls, told by lifetime counters that went backwards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from backends import BackendSpec, Strategy
from backends.client import SGLangClient
from gateway.poller import BackendPoller
from gateway.pool import Backend
from tests.support import serving


@asynccontextmanager
async def _backend(app: web.Application) -> AsyncIterator[Backend]:
    """`app` served on loopback, as a gateway Backend."""
    async with serving(app) as url:
        spec = BackendSpec(name="a", url=url, model="m", strategy=Strategy.DFLASH)
        backend = Backend(spec, SGLangClient(spec))
        try:
            yield backend
        finally:
            await backend.client.close()


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
    async with _backend(app) as backend:
        poller = BackendPoller(backend, engine_check_s=10.0)
        await poller.check_engine()
        ready, ok = backend.ready, poller.engine_ok
        await poller.check_engine()
        return ready, ok, asked == 2


def test_sglangs_own_failure_takes_the_backend_out():
    assert asyncio.run(_engine_check_with(503)) == (False, False, True)


def test_a_pass_keeps_it_in():
    assert asyncio.run(_engine_check_with(200)) == (True, True, True)


def test_an_answer_sglang_never_gives_is_no_verdict_and_ends_the_checks():
    for status in (404, 401, 500):  # an older server, a proxy wanting other credentials, a broken route
        assert asyncio.run(_engine_check_with(status)) == (True, True, False), status


def test_a_restart_between_two_polls_is_reported_and_server_info_read_again():
    """The server restarts faster than the readiness checks notice (it never failed one): its
    lifetime decode steps went from 1000 to 10. The cache is reported lost, and /server_info is
    read again, which now carries another cap."""
    steps = iter([1000, 1010, 10, 20])
    caps = iter([48, 7])
    lost: list[str] = []

    async def ready(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({"speculative_algorithm": "DFLASH", "max_running_requests": next(caps)})

    async def loads(_: web.Request) -> web.Response:
        rank = {
            "dp_rank": 0,
            "num_running_reqs": 1,
            "num_waiting_reqs": 0,
            "decode_moments": [next(steps), 0, 0, 0, 0, 0],
        }
        return web.json_response({"loads": [rank]})

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/v1/loads", loads)

    async def scenario() -> list[int]:
        async with _backend(app) as backend:
            poller = BackendPoller(backend, on_cache_lost=lost.append)
            seen = []
            for _ in range(4):
                await poller.poll_once()
                seen.append(backend.cap)
            return seen

    caps_seen = asyncio.run(scenario())
    assert lost == ["a"]  # once: at the report whose counters went back
    assert caps_seen == [48, 48, 48, 7]  # read again at the poll after it
