"""The litestar application: the OpenAI routes, probes, admin API; every error in OpenAI's shape.

Served behind the door (gateway.auth), which sits outside the router so that with keys configured
no route answers without one, unknown routes included. The generation routes are litestar ASGI
route handlers (gateway.generation); the rest are litestar's ordinary handlers. A request this
gateway forwarded before is answered 508 on every route (gateway.via).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from litestar import Litestar, Request, Response, Router, delete, get, post, route
from litestar.config.cors import CORSConfig
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.types import ASGIApp

from backends.client import AnswerTooLarge
from common.admin_api import AdminBackends, BackendState
from common.json_errors import JSON_DECODE_ERRORS
from gateway.access_log import AccessLog
from gateway.auth import AuthGate, posture, routed_path
from gateway.config import Config, ConfigError, load_config
from gateway.errors import ApiError, clip, model_not_found
from gateway.generation import ROUTES, GenerationRoutes
from gateway.openai_request import Kind
from gateway.pool import Backend
from gateway.request import BACKEND_HEADER, REQUEST_ID_HEADER, TRACE_ID_HEADER
from gateway.response_holders import response_segments
from gateway.response_ids import check_response_id
from gateway.runtime import Runtime
from gateway.tracing import Tracing
from gateway.via import forwarded_via, forwarding_loop, has_looped
from policies import Describes

log = logging.getLogger("specroute.app")
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def create_app(
    config: Config,
    *,
    config_path: str | Path | None = None,
    tracing: Tracing | None = None,
    access_log: AccessLog | None = None,
) -> Litestar:
    admits = posture(config)  # before anything starts: a reachable listener without keys is refused
    rt = Runtime(config, tracing=tracing, access_log=access_log)
    created = int(time.time())
    reload_lock = asyncio.Lock()
    reloads: set[asyncio.Future[None]] = set()  # SIGHUP reloads running

    def _json(obj: object, status: int = 200) -> Response[bytes]:
        return Response(_encoder.encode(obj), status_code=status, media_type="application/json")

    def _backend(name: str) -> Backend:
        backend = rt.pools.by_name.get(name)
        if backend is None:
            raise ApiError(404, f"no backend named {clip(name)}", code="backend_not_found")
        return backend

    async def _reload() -> dict[str, Any]:
        if config_path is None:
            raise ApiError(409, "this gateway runs the embedded topology, not a config file: nothing to reload")
        async with reload_lock:
            try:
                new = load_config(config_path)
            except ConfigError as e:  # the old config stays
                raise ApiError(400, f"config rejected, the running one is kept: {e}", code="invalid_config") from None
            new = rt.running(new)
            try:
                posture(new)
            except ConfigError as e:
                raise ApiError(400, f"config rejected, the running one is kept: {e}", code="invalid_config") from None
            if not new.backends:  # a half-written file, most likely: it would take every model offline
                raise ApiError(
                    400,
                    f"config rejected, the running one is kept: {config_path} has no backends, which would take "
                    "every model offline (to remove backends, take them out one by one: DELETE /admin/backends/{name})",
                    code="invalid_config",
                )
            return await rt.reload(new)

    def _model_card(model: str, adapter: str | None = None) -> dict[str, Any]:
        backends = [b for b in rt.pools.by_model[model] if adapter is None or adapter in b.adapters]
        # The context length a request can count on whichever backend it lands on: the smallest
        # any backend reported (SGLang's model card carries it; None until one has).
        lengths = [b.info.max_model_len for b in backends if b.info is not None and b.info.max_model_len]
        return {
            # An adapter's id is the name a request gives it (`model:adapter`), its parent the model.
            "id": model if adapter is None else f"{model}:{adapter}",
            "object": "model",
            "created": created,
            "owned_by": "specroute",
            "root": model if adapter is None else adapter,
            "parent": None if adapter is None else model,
            "max_model_len": min(lengths) if lengths else None,
            "backends": [b.name for b in backends],
        }

    def _model_cards() -> list[dict[str, Any]]:
        """One card per served model, not per backend (clients choose a model, the gateway a
        backend), then one per LoRA adapter loaded on any of its backends, as SGLang lists them."""
        cards = []
        for model in rt.pools.models():
            cards.append(_model_card(model))
            loaded: frozenset[str] = frozenset().union(*(b.adapters for b in rt.pools.by_model[model]))
            cards += [_model_card(model, adapter) for adapter in sorted(loaded)]
        return cards

    # Probes and scrapes answer HEAD as their GET without the body (uptime monitors and load
    # balancers check with HEAD; uvicorn sends no body after a HEAD, the headers are GET's).
    @route("/v1/models", http_method=["GET", "HEAD"])
    async def models() -> Response[bytes]:
        return _json({"object": "list", "data": _model_cards()})

    @get("/v1/models/{model:path}")
    async def retrieve_model(model: FromPath[str]) -> Response[bytes]:
        """One model's card (the OpenAI SDK's `models.retrieve`); a name may hold slashes."""
        model = model.removeprefix("/")  # litestar's path parameters keep their leading slash
        for card in _model_cards():
            if card["id"] == model:
                return _json(card)
        raise model_not_found(model, rt.pools.models())

    @route("/health", http_method=["GET", "HEAD"])
    async def health() -> Response[bytes]:
        return _json({"status": "ok"})

    @route("/ready", http_method=["GET", "HEAD"])
    async def ready() -> Response[bytes]:
        """200 when every served model has a backend up, as seen by at least one readiness check."""
        pending = [b.name for b in rt.pools.by_name.values() if not rt.poller.checked(b.name)]
        down = [m for m, bs in rt.pools.by_model.items() if not any(b.up for b in bs)]
        ok = not down and not pending
        return _json({"ready": ok, "models_without_backend": down, "not_yet_checked": pending}, 200 if ok else 503)

    @route("/metrics", http_method=["GET", "HEAD"])
    async def prometheus() -> Response[bytes]:
        return Response(rt.metrics.render(), media_type="text/plain; version=0.0.4")  # litestar appends the charset

    @route("/server_info", http_method=["GET", "HEAD"])
    async def server_info() -> Response[bytes]:
        """What SGLang's bench_serving reads, aggregated over the pool, so users' scripts work here too."""
        # SGLang's avg_spec_accept_length is a lifetime average: the backends' lifetime figures, as reported
        accepts = [
            b.load.lifetime_accept_length
            for b in rt.pools.by_name.values()
            if b.load is not None and b.load.lifetime_accept_length
        ]
        avg = sum(accepts) / len(accepts) if accepts else None
        return _json(
            {
                "served_model_names": rt.pools.models(),
                "gateway": "specroute",
                "max_running_requests": sum(b.cap for b in rt.pools.by_name.values()) or None,
                "internal_states": [{"avg_spec_accept_length": avg}],
            }
        )

    async def _at_holder(
        request: Request[Any, Any, Any], response_id: str, action: str | None = None
    ) -> Response[bytes]:
        """A stored Response is known only to the backend that made it (gateway.response_owners);
        one this gateway has no record of is looked for on every backend (gateway.response_holders)."""
        check_response_id(response_id, "response_id")
        via = forwarded_via(request.headers.get("via"))
        proxy = rt.proxy
        holder = proxy.response_owners.owner(response_id)
        backend = rt.pools.by_name.get(holder) if holder is not None else None
        if backend is None:
            found = await proxy.response_lookups.find(response_id, rt.pools.by_name.values(), via=via)
            if found is None:
                raise ApiError(
                    404,
                    f"Response with id {response_id!r} not found on any backend of this gateway.",
                    param="response_id",
                    code="response_not_found",
                )
            backend, body = found
            if action is None:  # the lookup's answer is the retrieval's
                return Response(
                    body, status_code=200, media_type="application/json", headers={BACKEND_HEADER: backend.name}
                )
        try:
            status, body = await backend.client.call(
                "GET" if action is None else "POST",
                response_segments(response_id, action),
                headers={"Via": via},
                max_bytes=rt.config.gateway.max_response_bytes,
            )
        except AnswerTooLarge as e:
            raise ApiError(
                502, f"backend {backend.name} answered more than {e.limit} bytes (gateway.max_response_bytes)"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            # as for a follow-up whose holder is down: only that backend can answer, later
            what = f"backend {backend.name}, which holds the response, is unreachable: {type(e).__name__}"
            raise ApiError(503, what, headers={"Retry-After": "1"}) from None
        return Response(body, status_code=status, media_type="application/json", headers={BACKEND_HEADER: backend.name})

    @get("/v1/responses/{response_id:str}")
    async def retrieve_response(request: Request[Any, Any, Any], response_id: FromPath[str]) -> Response[bytes]:
        """`client.responses.retrieve`: asked of the backend that stored it."""
        return await _at_holder(request, response_id)

    @post("/v1/responses/{response_id:str}/cancel", status_code=200)
    async def cancel_response(request: Request[Any, Any, Any], response_id: FromPath[str]) -> Response[bytes]:
        """`client.responses.cancel` of a background Response, at the backend running it."""
        return await _at_holder(request, response_id, "cancel")

    @get("/admin/backends")
    async def admin_backends() -> Response[bytes]:
        return _json(
            AdminBackends(
                inflight=rt.admission.inflight,
                waiting=rt.admission.waiting,
                rejected=rt.admission.rejected,
                retries=rt.proxy.retries,
                access_log_dropped=rt.proxy.access_log.dropped,
                spans_dropped=rt.tracing.dropped,
                policies=_policies(rt),
                backends=[_backend_state(b, rt) for b in rt.pools.by_name.values()],
                retiring=[_backend_state(b, rt) for b in rt.retiring],
            )
        )

    @post("/admin/backends", status_code=201)
    async def add_backend(request: Request[Any, Any, Any]) -> Response[bytes]:
        try:
            data = _decoder.decode(await request.body())
        except JSON_DECODE_ERRORS as e:
            raise ApiError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "expected a JSON object with name, url, model, strategy")
        name = data.get("name")
        if not isinstance(name, str):
            raise ApiError(
                400, f"'name' must be a string, got {type(name).__name__}", param="name", code="invalid_backend"
            )
        async with reload_lock:  # one change of the pool at a time: a reload replaces the whole config
            if name in rt.pools.by_name:
                raise ApiError(409, f"backend {clip(name)} exists already", code="backend_exists")
            try:
                backend = await rt.add_backend(data)
            except ConfigError as e:
                raise ApiError(400, str(e), code="invalid_backend") from None
        return _json(_backend_state(backend, rt), 201)

    @delete("/admin/backends/{name:str}", status_code=200)
    async def remove_backend(name: FromPath[str]) -> Response[bytes]:
        async with reload_lock:
            backend = _backend(name)
            try:
                await rt.remove_backend(name)
            except ConfigError as e:  # the config without it does not hold, e.g. a model pinned to it
                raise ApiError(409, f"backend {name!r} cannot be removed: {e}", code="backend_in_use") from None
        return _json({"removed": name, "inflight_finishing": backend.inflight})

    @post("/admin/backends/{name:str}/drain", status_code=200)
    async def drain(name: FromPath[str]) -> Response[bytes]:
        backend = _backend(name)
        backend.draining = True
        return _json(_backend_state(backend, rt))

    @post("/admin/backends/{name:str}/undrain", status_code=200)
    async def undrain(name: FromPath[str]) -> Response[bytes]:
        backend = _backend(name)
        backend.draining = False
        rt.admission.kick()
        return _json(_backend_state(backend, rt))

    @post("/admin/reload", status_code=200)
    async def reload() -> Response[bytes]:
        return _json(await _reload())

    async def on_startup() -> None:
        (log.warning if admits.mode != "keys" else log.info)("access: %s", admits.message)
        await rt.start()
        if config_path is not None:
            rt.watch_config(config_path, _reload)  # a change on disk is applied as SIGHUP applies it
            loop = asyncio.get_running_loop()

            def on_sighup() -> None:
                async def run() -> None:
                    try:
                        await _reload()
                    except ApiError as e:
                        log.error("SIGHUP reload: %s", e.message)

                task = asyncio.ensure_future(run())
                reloads.add(task)  # held until done: the loop keeps only a weak reference to a task
                task.add_done_callback(reloads.discard)

            # not the main thread (tests) or no signals: no SIGHUP reload, POST /admin/reload still works
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, on_sighup)

    async def on_shutdown() -> None:
        await rt.stop()

    def refused(kind: Kind, headers: Mapping[str, str], error: ApiError, t_received: float) -> None:
        rt.refusals.body_refused(error.status)  # counted among the door's refusals (gateway/refusals.py)
        rt.proxy.refused(kind, error, t_received, headers=headers)

    def http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
        error = _http_error(exc)
        # Refused by litestar's router before any route ran (its host check): a generation request
        # still gets its record, as every refused one does.
        if "route_handler" not in request.scope and (kind := ROUTES.get(routed_path(request.scope))) is not None:
            refused(kind, dict(request.headers), error, time.perf_counter())
        return error.response()

    # The generation routes: rt.proxy is looked up per request (a reload may replace it).
    generation = GenerationRoutes(
        lambda body, kind, headers, trace, client: rt.proxy.serve(body, kind, headers, trace, client),
        refused,
        lambda: rt.config,
        rt.tracing,
        rt.body_budget,
    )
    probes: list[BaseRouteHandler] = [health, ready, prometheus]  # never traced: they would outnumber requests
    api: list[BaseRouteHandler] = [
        models,
        retrieve_model,
        retrieve_response,
        cancel_response,
        server_info,
        admin_backends,
        add_backend,
        remove_backend,
        drain,
        undrain,
        reload,
    ]
    traced: list[Router | BaseRouteHandler] = list(api)
    if rt.tracing.enabled:  # their SERVER spans; the generation routes make their own
        tracing = rt.tracing

        def server_spans(app: ASGIApp) -> ASGIApp:  # a function: litestar deep-copies a router's middleware
            return tracing.server_span_middleware(app)

        traced = [Router("/", route_handlers=api, middleware=[server_spans])]
    origins = config.gateway.cors_allow_origins
    app = Litestar(
        route_handlers=[*generation.handlers(), *probes, *traced],
        exception_handlers={ApiError: _api_error, HTTPException: http_error, Exception: _unexpected},
        before_request=_refuse_loops,
        cors_config=CORSConfig(
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["*"],
            # what a browser client may read: who served it, the request and trace ids
            expose_headers=[BACKEND_HEADER, REQUEST_ID_HEADER, TRACE_ID_HEADER],
        )
        if origins
        else None,
        request_max_body_size=config.gateway.max_body_bytes,
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    app.state.runtime = rt
    return app


def create_asgi(config: Config, **kwargs: Any) -> AuthGate:
    """The app as served: the door (gateway.auth) around the litestar app."""
    return serving_asgi(create_app(config, **kwargs))


def serving_asgi(app: Litestar) -> AuthGate:
    """`create_asgi` for an app already made (`app.state.runtime` is its Runtime)."""
    rt: Runtime = app.state.runtime
    return AuthGate(app, rt.config, lambda: rt.config, app.cors_config, rt.refusals)


def _refuse_loops(request: Request[Any, Any, Any]) -> None:
    """Every route litestar's handlers answer (readiness checks and Response lookups from a
    gateway whose backend this is); the generation routes check their own (gateway.generation)."""
    for name, value in request.scope["headers"]:
        if name == b"via" and has_looped(value.decode("latin-1")):
            raise forwarding_loop()


def _policies(rt: Runtime) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model, policy in rt.policies.items():
        views = [b.view for b in rt.pools.by_model.get(model, [])]
        out[model] = {"name": policy.name, **(policy.describe(views) if isinstance(policy, Describes) else {})}
    return out


def _backend_state(b: Backend, rt: Runtime) -> BackendState:
    poller = rt.poller.pollers.get(b.name)
    return BackendState(
        name=b.name,
        url=b.spec.url,
        model=b.spec.model,
        strategy=b.spec.strategy.value,
        up=b.up,
        ready=b.ready,
        draining=b.draining,
        circuit=b.circuit.state.value,
        inflight=b.inflight,
        cap=b.cap,
        reported_load=msgspec.to_builtins(b.load) if b.load else None,
        server_info=msgspec.to_builtins(b.info) if b.info else None,
        load_source=poller.load_source if poller else None,
        health_checks=poller.checks if poller else None,
        engine_ok=poller.engine_ok if poller else None,
        loop_detected=poller.looped if poller else None,
        adapters=sorted(b.adapters),
    )


def _api_error(_: Request[Any, Any, Any], exc: ApiError) -> Response[Any]:
    return exc.response()


def _http_error(exc: HTTPException) -> ApiError:
    status = exc.status_code
    message = {404: "no such route", 405: "method not allowed for this route", 413: "request body too large"}.get(
        status, str(exc.detail)
    )
    return ApiError(status, message, headers=dict(exc.headers or {}))


def _unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    # Never a traceback to the client; the operator gets it in the log.
    log.error("unhandled error", exc_info=exc)
    return ApiError(500, "internal gateway error", type="api_error").response()
