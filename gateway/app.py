"""The litestar application: OpenAI routes, health, admin view; every error in OpenAI's shape."""

from __future__ import annotations

import logging
import time

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException

from backends.client import SGLangClient
from gateway.config import Config
from gateway.errors import ApiError
from gateway.poller import Poller
from gateway.pool import Backend, Pools
from gateway.proxy import Proxy
from policies import make_policy

log = logging.getLogger("specroute.app")
_encoder = msgspec.json.Encoder()


def build_pools(config: Config) -> Pools:
    return Pools(
        Backend(spec, SGLangClient(spec, connections=config.gateway.upstream_connections,
                                   connect_timeout_s=config.gateway.connect_timeout_s))
        for spec in config.backend_specs()
    )


def build_policies(config: Config, pools: Pools) -> dict:
    policies = {}
    for model in pools.models():
        section = config.models.get(model)
        policies[model] = make_policy(config.policy_for(model),
                                      pinned_backend=section.pinned_backend if section else None)
    return policies


def create_app(config: Config) -> Litestar:
    pools = build_pools(config)
    proxy = Proxy(pools, build_policies(config, pools))
    poller = Poller(pools, interval_s=config.gateway.poll_interval_s)
    created = int(time.time())

    def _json(obj: object, status: int = 200) -> Response[bytes]:
        return Response(_encoder.encode(obj), status_code=status, media_type="application/json")

    @post("/v1/chat/completions", status_code=200)
    async def chat_completions(request: Request) -> Response:
        return await proxy.handle(await request.body(), "chat", request.headers)

    @post("/v1/completions", status_code=200)
    async def completions(request: Request) -> Response:
        return await proxy.handle(await request.body(), "completion", request.headers)

    @get("/v1/models")
    async def models() -> Response[bytes]:
        # One entry per served model, not per backend: clients choose a model, the gateway a backend.
        data = [{"id": m, "object": "model", "created": created, "owned_by": "specroute",
                 "root": m, "backends": [b.name for b in pools.by_model[m]]} for m in pools.models()]
        return _json({"object": "list", "data": data})

    @get("/health")
    async def health() -> Response[bytes]:
        return _json({"status": "ok", "backends": len(pools.by_name)})

    @get("/admin/backends")
    async def admin_backends() -> Response[bytes]:
        return _json({"backends": [_backend_state(b, poller) for b in pools.by_name.values()]})

    async def on_startup() -> None:
        poller.start()

    async def on_shutdown() -> None:
        await poller.stop()
        await pools.close()

    return Litestar(
        route_handlers=[chat_completions, completions, models, health, admin_backends],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
        request_max_body_size=config.gateway.max_body_bytes,
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )


def _backend_state(b: Backend, poller: Poller) -> dict:
    state: dict = {"name": b.name, "url": b.spec.url, "model": b.spec.model, "strategy": b.spec.strategy.value,
                   "healthy": b.view.healthy, "inflight": b.inflight}
    state["reported_load"] = msgspec.to_builtins(b.load) if b.load else None
    state["server_info"] = msgspec.to_builtins(b.info) if b.info else None
    state["load_source"] = poller.pollers[b.name].load_source
    return state


def _api_error(_: Request, exc: ApiError) -> Response:
    return exc.response()


def _http_error(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    message = {404: "no such route", 405: "method not allowed for this route",
               413: "request body too large"}.get(status, str(exc.detail))
    return ApiError(status, message, headers=dict(exc.headers or {})).response()


def _unexpected(_: Request, exc: Exception) -> Response:
    # Never a traceback to the client; the operator gets it in the log.
    log.error("unhandled error", exc_info=exc)
    return ApiError(500, "internal gateway error", type="api_error").response()
