"""backends.client.SGLangClient on real HTTP: the URLs it sends to."""

from __future__ import annotations

import asyncio

from aiohttp import web

from backends import BackendSpec, Strategy
from backends.client import SGLangClient
from tests.support import serving


def test_a_backend_behind_a_path_prefix_keeps_it_on_every_request():
    """An ingress that routes `/k26-dflash/...` to one SGLang server: the prefix stays in front of
    every path the gateway asks for, queries included (it used to be joined over, or refused)."""
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.json_response({"ok": True})

    async def scenario() -> tuple[int, int]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        async with serving(app) as url:
            spec = BackendSpec(name="a", url=f"{url}/k26-dflash", model="m", strategy=Strategy.DFLASH)
            client = SGLangClient(spec)
            try:
                status, _ = await client.get("/v1/loads?include=core,spec")
                resp = await client.post("/v1/chat/completions", b"{}")
                resp.release()
                return status, resp.status
            finally:
                await client.close()

    assert asyncio.run(scenario()) == (200, 200)
    assert seen == ["/k26-dflash/v1/loads?include=core,spec", "/k26-dflash/v1/chat/completions"]
