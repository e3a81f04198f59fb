"""The litestar application: OpenAI routes, probes, admin; every error in OpenAI's shape."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post

from litestar.exceptions import HTTPException
from litestar.params import FromPath

from backends.client import SGLangClient
from gateway.admission import Admission
from gateway.auth import AuthGate
from gateway.circuit import CircuitBreaker
from gateway.config import Config
from gateway.access_log import AccessLog
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.poller import Poller
from gateway.pool import Backend, Pools
from gateway.proxy import Proxy
from gateway.tracing import Tracing
from policies import Policy, make_policy

log = logging.getLogger("specroute.app")
_encoder = msgspec.json.Encoder()


def build_pools(config: Config) -> Pools:
    health = config.health
    return Pools(
        Backend(spec,
                SGLangClient(spec, connections=config.gateway.upstream_connections,
                             connect_timeout_s=config.timeouts.connect_s),
                CircuitBreaker(health.circuit_failures, health.circuit_cooldown_s),
                cap=config.admission.backend_max_inflight)
        for spec in config.backend_specs()
    )


def build_policies(config: Config, pools: Pools) -> dict[str, Policy]:
    policies = {}
    for model in pools.models():
        section = config.models.get(model)
        policies[model] = make_policy(config.policy_for(model),
                                      pinned_backend=section.pinned_backend if section else None)
    return policies


def create_app(config: Config, *, tracing: Tracing | None = None, access_log: AccessLog | None = None) -> Litestar:
    pools = build_pools(config)
    a = config.admission
    admission = Admission(pools, max_inflight=a.max_inflight, max_queue=a.max_queue, queue_timeout_s=a.queue_timeout_s)
    metrics = GatewayMetrics()
    metrics.watch(pools, admission)
    tracing = tracing or Tracing(config.tracing)
    proxy = Proxy(pools, admission, build_policies(config, pools), config, metrics=metrics, tracing=tracing,
                  access_log=access_log)
    poller = Poller(pools, config.health, on_change=admission.kick)
    created = int(time.time())

    def _json(obj: object, status: int = 200) -> Response[bytes]:
        return Response(_encoder.encode(obj), status_code=status, media_type="application/json")

    def _backend(name: str) -> Backend:
        backend = pools.by_name.get(name)
        if backend is None:
            raise ApiError(404, f"no backend named {name!r}", code="backend_not_found")
        return backend

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
        return _json({"status": "ok"})

    @get("/ready")
    async def ready() -> Response[bytes]:
        """200 when every served model has at least one backend up; 503 otherwise."""
        down = [m for m, bs in pools.by_model.items() if not any(b.up for b in bs)]
        return _json({"ready": not down, "models_without_backend": down}, 503 if down else 200)

    @get("/metrics")
    async def prometheus() -> Response[bytes]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @get("/server_info")
    async def server_info() -> Response[bytes]:
        """What SGLang's bench_serving reads, aggregated over the pool, so users' scripts work here too."""
        accepts = [b.load.accept_length for b in pools.by_name.values()
                   if b.load is not None and b.load.accept_length]
        avg = sum(accepts) / len(accepts) if accepts else None
        return _json({"served_model_names": pools.models(), "gateway": "specroute",
                      "max_running_requests": sum(b.cap for b in pools.by_name.values()) or None,
                      "internal_states": [{"avg_spec_accept_length": avg}]})

    @get("/admin/backends")
    async def admin_backends() -> Response[bytes]:
        return _json({"inflight": admission.inflight, "waiting": admission.waiting, "rejected": admission.rejected,
                      "retries": proxy.retries,
                      "backends": [_backend_state(b, poller) for b in pools.by_name.values()]})

    @post("/admin/backends/{name:str}/drain", status_code=200)
    async def drain(name: FromPath[str]) -> Response[bytes]:
        backend = _backend(name)
        backend.draining = True
        return _json(_backend_state(backend, poller))

    @post("/admin/backends/{name:str}/undrain", status_code=200)
    async def undrain(name: FromPath[str]) -> Response[bytes]:
        backend = _backend(name)
        backend.draining = False
        admission.kick()
        return _json(_backend_state(backend, poller))

    async def on_startup() -> None:
        poller.start()

    async def on_shutdown() -> None:
        await poller.stop()
        await pools.close()
        tracing.shutdown()

    return Litestar(
        route_handlers=[chat_completions, completions, models, health, ready, prometheus, server_info,
                        admin_backends, drain, undrain],
        plugins=[tracing.litestar_plugin()] if tracing.enabled else [],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
        request_max_body_size=config.gateway.max_body_bytes,
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )


def create_asgi(config: Config, **kwargs: Any) -> Any:
    """The app as served: API-key gate outside the router, so unknown routes need a key too."""
    return AuthGate(create_app(config, **kwargs), config.auth)


def _backend_state(b: Backend, poller: Poller) -> dict:
    return {
        "name": b.name, "url": b.spec.url, "model": b.spec.model, "strategy": b.spec.strategy.value,
        "up": b.up, "ready": b.ready, "draining": b.draining, "circuit": b.circuit.state.value,
        "inflight": b.inflight, "cap": b.cap,
        "reported_load": msgspec.to_builtins(b.load) if b.load else None,
        "server_info": msgspec.to_builtins(b.info) if b.info else None,
        "load_source": poller.pollers[b.name].load_source,
    }


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
