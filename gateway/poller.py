"""Background polling of every backend, off the request path.

- `/server_info` (fallback `/get_server_info`) until it answers once: algorithm, cap, served name.
- `/v1/models` then, and every `health.models_refresh_s`: the context length (`max_model_len`,
  which the gateway's own cards carry) and the LoRA adapters loaded (SGLang lists one card each,
  and its `/load_lora_adapter` and `/unload_lora_adapter` change them at runtime).
- `/v1/loads` every `health.interval_s`; on 404 it falls back to `/get_load`, then `/metrics`, and
  remembers which one works, so older SGLang 0.5.x releases are served too. On a speculative
  server run with `--enable-metrics`, `/metrics` too, for its windowed acceptance gauge.
- The policies' `reported_accept_length` is a windowed figure (backends/acceptance_window.py):
  the gauge, else the difference of `/v1/loads` decode moments between polls, else None (the
  lifetime average /v1/loads publishes is never passed on as if it were recent).
- `/ready` (fallback `/health`) for readiness: `unhealthy_after` consecutive failures take a backend
  out of the pool, `healthy_after` consecutive successes bring it back.
- `/health_generate` every `health.engine_check_s`, beside the rest: SGLang's check that its engine
  still steps (a 1-token request when idle; 503 after 20 s without a finished batch). A hung engine
  leaves `/ready` at 200 until such a check fails, so without it a hung server would keep getting
  requests. A failed check takes the backend out at once; it is back only once a check passes (they
  then run every `interval_s`) and its readiness checks pass.
- A backend that may have lost its radix cache is reported (`on_cache_lost`): it came back into the
  pool after being out (an SGLang restart always passes through that; so does a weight update,
  which flushes the cache), or its lifetime counters went backwards between two reports (a restart
  faster than the readiness checks). The policies then forget which prefixes it held, and its
  `/server_info` is read again: a restart may have changed its flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec

from backends.acceptance_window import AcceptanceWindow
from backends.loads import (
    LoadReport,
    ModelCards,
    ServerInfo,
    parse_get_load,
    parse_loads,
    parse_metrics,
    parse_model_cards,
    parse_server_info,
)
from common.json_errors import JSON_DECODE_ERRORS
from gateway.config import HealthSection
from gateway.pool import Backend
from gateway.via import LOOP_STATUS

log = logging.getLogger("specroute.poller")
_decoder = msgspec.json.Decoder()
_NET_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_HEALTH_FALLBACK_S = 5.0  # the `/health` call of a server without `/ready`


class BackendPoller:
    def __init__(
        self,
        backend: Backend,
        *,
        interval_s: float = 1.0,
        unhealthy_after: int = 2,
        healthy_after: int = 1,
        engine_check_s: float = 0.0,
        engine_check_timeout_s: float = 30.0,
        models_refresh_s: float = 10.0,
        on_change: Callable[[], None] | None = None,
        on_cache_lost: Callable[[str], None] | None = None,
        queue_order: Callable[[], str] | None = None,
    ) -> None:
        self.backend = backend
        self.queue_order = queue_order  # the gateway's admission.priority_order, to compare with the server's
        self.models_refresh_s = models_refresh_s  # 0: /v1/models at start and after restarts only
        self._models_read_at: float | None = None  # monotonic; None: to be read at the next poll
        self.on_change = on_change
        self.on_cache_lost = on_cache_lost
        self.interval_s = interval_s
        self.unhealthy_after = unhealthy_after
        self.healthy_after = healthy_after
        self.engine_check_s = engine_check_s  # 0: no engine checks
        self.engine_check_timeout_s = engine_check_timeout_s
        self.engine_ok = True  # the last engine check passed (or none has run)
        self._engine_path: str | None = "/health_generate"  # None: the server has no such route
        self._load_path: str | None = "/v1/loads?include=core,spec"
        self._ready_path = "/ready"
        self._fails = 0
        self._successes = 0
        self.checks = 0  # readiness checks done; /ready waits for the first
        self.looped = False  # the last readiness check came back to this gateway (gateway.via)
        self.first_checked = asyncio.Event()  # set once the first poll is done (`Poller.first_check`)
        self._info_stale = False  # /server_info to be read again (the backend may have restarted)
        self.window = AcceptanceWindow()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._engine_checks())
            while True:
                try:
                    await self.poll_once()
                except Exception:  # a bug, or an answer no parser foresaw: never the end of polling
                    log.exception("polling backend %s failed", self.backend.name)
                # the first poll is done: readiness, and /server_info, /v1/models, /v1/loads when it answers
                self.first_checked.set()
                await asyncio.sleep(self.interval_s)

    async def _engine_checks(self) -> None:
        while self._engine_path is not None:
            if self.engine_check_s <= 0:  # off (a reload may turn it on)
                await asyncio.sleep(self.interval_s)
                continue
            await asyncio.sleep(self.engine_check_s if self.engine_ok else self.interval_s)
            try:
                await self.check_engine()
            except Exception:
                log.exception("engine check of backend %s failed", self.backend.name)

    async def check_engine(self) -> None:
        """One `/health_generate`; a failure takes the backend out of the pool at once."""
        path = self._engine_path
        if path is None:
            return
        try:
            status, _ = await self.backend.client.get(path, timeout_s=self.engine_check_timeout_s)
        except aiohttp.ConnectionTimeoutError:
            return  # no connection in time (none free, or none made): no verdict on the engine
        except TimeoutError:
            status = None  # asked, and not even a 503 in time: its HTTP server is stuck too
        except _NET_ERRORS:
            return  # unreachable: the readiness checks take it out
        if status not in (200, 503, None):
            # SGLang answers 200 or 503. Anything else (404 on an older server, 401 behind a proxy
            # that wants other credentials) is no verdict on the engine: readiness checks only.
            log.warning(
                "backend %s answered %s to %s: no engine checks for it, readiness checks only",
                self.backend.name,
                status,
                path,
            )
            self._engine_path = None
            self.engine_ok = True  # no verdict holds it out of the pool
            return
        was_ok, self.engine_ok = self.engine_ok, status == 200
        backend = self.backend
        if was_ok and not self.engine_ok:
            log.warning(
                "backend %s failed SGLang's engine check (%s): no batch finished within its timeout, out of the pool",
                backend.name,
                f"HTTP {status}" if status is not None else f"no answer in {self.engine_check_timeout_s:g}s",
            )
            if backend.ready:
                backend.ready = False
                self._successes = 0
                if self.on_change is not None:
                    self.on_change()
            # Requests waiting there are tried elsewhere rather than wait out their timeouts, or
            # SGLang's watchdog; streams under way end now, not after idle_stream_s.
            given_up = backend.stalled()
            if given_up:
                log.warning(
                    "backend %s: %d request(s) given up: those waiting moved to other backends, streams ended",
                    backend.name,
                    given_up,
                )
        elif self.engine_ok and not was_ok:
            log.warning("backend %s passed SGLang's engine check again", backend.name)

    async def poll_once(self) -> None:
        await self._check_ready()
        backend = self.backend
        if backend.info is None or self._info_stale:
            info = await self._server_info()
            if info is not None:
                cards = await self._model_cards(info.served_model_name)
                old_len = backend.info.max_model_len if backend.info is not None else None
                backend.info = msgspec.structs.replace(
                    info, max_model_len=cards.max_model_len if cards is not None else old_len
                )
                if cards is not None:
                    backend.adapters = cards.adapters
                self._info_stale = False
                self._apply_info(backend.info)
        elif self._models_due():
            cards = await self._model_cards(backend.info.served_model_name)
            if cards is not None:  # no answer: the adapters last seen stand
                backend.adapters = cards.adapters
                if cards.max_model_len != backend.info.max_model_len:
                    backend.info = msgspec.structs.replace(backend.info, max_model_len=cards.max_model_len)
        if self.backend.ready:
            inflight_before = self.backend.inflight
            report = await self._load()
            if report is not None:
                gauge = await self._accept_gauge() if report.source != "metrics" else None
                self._apply_load(report, inflight_before, gauge)

    @property
    def ready_timeout_s(self) -> float:
        """The longest one readiness call may take."""
        return max(1.0, self.interval_s * 2)

    async def _check_ready(self) -> None:
        ok = False
        try:
            status, _ = await self.backend.client.get(self._ready_path, timeout_s=self.ready_timeout_s)
            if status == 404 and self._ready_path == "/ready":
                self._ready_path = "/health"  # very old servers: no /ready
                status, _ = await self.backend.client.get(self._ready_path, timeout_s=_HEALTH_FALLBACK_S)
            ok = status == 200
        except _NET_ERRORS:
            ok, status = False, None
        backend = self.backend
        self.checks += 1
        was_up = backend.up
        looped, self.looped = self.looped, status == LOOP_STATUS
        if ok:
            self._fails, self._successes = 0, self._successes + 1
            if not backend.ready and self._successes >= self.healthy_after and self.engine_ok:
                log.warning("backend %s is ready again", backend.name)
                backend.ready = True
                self._cache_lost()
        else:
            self._successes, self._fails = 0, self._fails + 1
            if self.looped:  # its URL leads back to this gateway: out at once, not after unhealthy_after checks
                if not looped:
                    log.error(
                        "backend %s (%s) forwards back to this gateway (508 Loop Detected): its URL points at "
                        "this gateway, or at a gateway that forwards here; it gets no requests",
                        backend.name,
                        backend.spec.url,
                    )
                backend.ready = False
            elif backend.ready and self._fails >= self.unhealthy_after:
                log.warning("backend %s failed %d readiness checks: out of the pool", backend.name, self._fails)
                backend.ready = False
        if backend.up != was_up and self.on_change is not None:
            self.on_change()

    async def _server_info(self) -> ServerInfo | None:
        for path in ("/server_info", "/get_server_info"):
            status, data = await self._get_json(path)
            if status == 200:
                return parse_server_info(data)
            if status is None:  # unreachable: no fallback either
                return None
        return None

    async def _get_json(self, path: str) -> tuple[int | None, Any]:
        """(status, the decoded body or None when it is not JSON); status None when unreachable."""
        try:
            status, body = await self.backend.client.get(path)
        except _NET_ERRORS:
            return None, None
        try:
            return status, _decoder.decode(body)
        except JSON_DECODE_ERRORS:
            return status, None

    def _cache_lost(self) -> None:
        """Maybe restarted: its cache is gone, and it may run with other flags (cap, algorithm,
        context length), so /server_info and /v1/models are read again at the next poll (the old
        ones stand until then)."""
        self._info_stale = True
        if self.on_cache_lost is not None:
            self.on_cache_lost(self.backend.name)

    def _models_due(self) -> bool:
        return self.models_refresh_s > 0 and (
            self._models_read_at is None or time.monotonic() - self._models_read_at >= self.models_refresh_s
        )

    async def _model_cards(self, served_model_name: str | None) -> ModelCards | None:
        self._models_read_at = time.monotonic()
        status, data = await self._get_json("/v1/models")
        cards = parse_model_cards(data, served_model_name) if status == 200 else None
        if cards is not None and cards.adapters != self.backend.adapters:
            log.info("backend %s: LoRA adapters loaded: %s", self.backend.name, sorted(cards.adapters) or "none")
        return cards

    def _apply_load(self, report: LoadReport, inflight_before: int, gauge: float | None = None) -> None:
        """Publish a report to the policies' view, with our own in-flight at the time it was taken,
        so that the load of other gateway replicas can be told apart from ours."""
        backend = self.backend
        previous = backend.load
        if previous is not None and report.restarted_since(previous):
            log.warning("backend %s restarted (its lifetime counters went backwards)", backend.name)
            self._cache_lost()
        if backend.spec.strategy.speculative:
            accept = self.window.update(report, gauge)
            report = msgspec.structs.replace(report, accept_length=accept, accept_source=self.window.source)
        backend.load = report
        view = backend.view
        view.reported_running = report.running
        view.reported_waiting = report.waiting
        view.reported_accept_length = report.accept_length
        # the server's own step-time and prefill counters (policies/server_counters.py)
        view.decode_moments = report.decode_moments
        view.prefill_counters = report.prefill_counters
        view.note_prefill_report()
        # the report was taken somewhere between sending the poll and its answer
        view.reported_inflight = (inflight_before + backend.inflight) // 2 if report.running is not None else None
        info = backend.info
        if report.max_running and not (info is not None and info.max_running_requests):
            view.max_running = report.max_running  # the live cap, unless /server_info has the flag's
        if report.max_total_tokens:
            view.kv_tokens = report.max_total_tokens

    def _apply_info(self, info: ServerInfo) -> None:
        self.backend.view.max_running = info.max_running_requests or self.backend.view.max_running
        spec = self.backend.spec
        if spec.strategy.speculative != (info.speculative_algorithm is not None):
            log.warning(
                "backend %s is configured as %s but reports speculative_algorithm=%s",
                spec.name,
                spec.strategy.value,
                info.speculative_algorithm,
            )
        order = self.queue_order() if self.queue_order is not None else None
        if info.priority_order is not None and order not in (None, "fifo", info.priority_order):
            log.warning(
                "backend %s schedules priority %s but admission.priority_order is %s: the gateway's queue "
                "and the server's serve priorities in opposite orders",
                spec.name,
                info.priority_order,
                order,
            )

    async def _accept_gauge(self) -> float | None:
        """The windowed acceptance gauge of a speculative server that serves /metrics."""
        info = self.backend.info
        if info is None or not info.enable_metrics or not self.backend.spec.strategy.speculative:
            return None
        try:
            status, body = await self.backend.client.get("/metrics")
        except _NET_ERRORS:
            return None
        report = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else None
        return report.accept_length if report is not None else None

    async def _load(self) -> LoadReport | None:
        while self._load_path is not None:
            try:
                status, body = await self.backend.client.get(self._load_path)
            except _NET_ERRORS:
                return None
            if status == 404:
                self._load_path = _NEXT_LOAD_PATH.get(self._load_path.split("?")[0])
                if self._load_path:
                    log.info("backend %s: falling back to %s for load", self.backend.name, self._load_path)
                continue
            if status != 200:
                return None
            try:
                if self._load_path.startswith("/metrics"):
                    return parse_metrics(body.decode("utf-8", "replace"))
                data = _decoder.decode(body)
            except JSON_DECODE_ERRORS:
                return None
            return parse_loads(data) if self._load_path.startswith("/v1/loads") else parse_get_load(data)
        return None

    @property
    def load_source(self) -> str | None:
        return self._load_path


_NEXT_LOAD_PATH = {"/v1/loads": "/get_load", "/get_load": "/metrics", "/metrics": None}


class Poller:
    """One polling task per backend, started with the app; backends can come and go at runtime."""

    def __init__(
        self,
        health: HealthSection,
        on_change: Callable[[], None] | None = None,
        on_cache_lost: Callable[[str], None] | None = None,
        queue_order: Callable[[], str] | None = None,
    ) -> None:
        self.health = health
        self.on_change = on_change
        self.on_cache_lost = on_cache_lost
        self.queue_order = queue_order
        self.pollers: dict[str, BackendPoller] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False

    def configure(self, health: HealthSection) -> None:
        """New [health] settings (reload): running pollers pick them up at their next round."""
        self.health = health
        for p in self.pollers.values():
            p.interval_s, p.unhealthy_after, p.healthy_after = (
                health.interval_s,
                health.unhealthy_after,
                health.healthy_after,
            )
            p.engine_check_s, p.engine_check_timeout_s = health.engine_check_s, health.engine_check_timeout_s
            p.models_refresh_s = health.models_refresh_s

    def add(self, backend: Backend) -> None:
        h = self.health
        self.pollers[backend.name] = BackendPoller(
            backend,
            interval_s=h.interval_s,
            unhealthy_after=h.unhealthy_after,
            healthy_after=h.healthy_after,
            engine_check_s=h.engine_check_s,
            engine_check_timeout_s=h.engine_check_timeout_s,
            models_refresh_s=h.models_refresh_s,
            on_change=self.on_change,
            on_cache_lost=self.on_cache_lost,
            queue_order=self.queue_order,
        )
        if self._running:
            self._start(backend.name)

    async def remove(self, name: str) -> None:
        self.pollers.pop(name, None)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def first_check(self, name: str) -> None:
        """Until backend `name`'s first poll is done (its readiness, and what it says of itself),
        at most as long as a readiness check can take."""
        poller = self.pollers.get(name)
        if poller is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(poller.first_checked.wait(), poller.ready_timeout_s + _HEALTH_FALLBACK_S)

    def checked(self, name: str) -> bool:
        poller = self.pollers.get(name)
        return poller is None or poller.checks > 0

    def _start(self, name: str) -> None:
        self._tasks[name] = asyncio.create_task(self.pollers[name].run(), name=f"poll-{name}")

    def start(self) -> None:
        self._running = True
        for name in self.pollers:
            self._start(name)

    async def stop(self) -> None:
        self._running = False
        for name in list(self._tasks):
            await self.remove(name)
