"""Served model -> pool of backends, the gateway's own in-flight accounting, and who may take a request.

A backend takes new requests when it is ready (poller), its circuit allows it, it is not being
drained, and it is below its in-flight cap. In-flight is counted from dispatch to stream end,
error or disconnect by a `Lease` that releases exactly once.
"""

from __future__ import annotations

from typing import Callable, Iterable

from backends import BackendSpec
from backends.client import SGLangClient
from backends.loads import LoadReport, ServerInfo
from gateway.circuit import CircuitBreaker
from policies import BackendView


class Backend:
    """One upstream as the gateway runs it: client, live view for policies, health, in-flight."""

    __slots__ = ("spec", "client", "view", "info", "load", "circuit", "ready", "draining", "cap_override",
                 "_on_release")

    def __init__(self, spec: BackendSpec, client: SGLangClient, circuit: CircuitBreaker | None = None,
                 cap: int = 0) -> None:
        self.spec = spec
        self.client = client
        self.view = BackendView(spec=spec)
        self.info: ServerInfo | None = None  # from /server_info, once
        self.load: LoadReport | None = None  # latest backend-reported load
        self.circuit = circuit or CircuitBreaker()
        self.ready = True          # optimistic until the first readiness check says otherwise
        self.draining = False      # no new requests; in-flight ones finish
        self.cap_override = cap    # 0: use the backend's own max_running_requests once known
        self._on_release: Callable[["Backend"], None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def inflight(self) -> int:
        return self.view.inflight

    @property
    def cap(self) -> int:
        """Largest number of requests in flight the gateway sends here; 0 = no cap known."""
        if self.cap_override:
            return self.cap_override
        return (self.info.max_running_requests or 0) if self.info else 0

    @property
    def up(self) -> bool:
        """Could take traffic if it had room: ready, circuit not open, not draining."""
        return self.ready and not self.draining and self.circuit.allows()

    @property
    def has_room(self) -> bool:
        cap = self.cap
        return cap == 0 or self.view.inflight < cap

    def refresh_view(self) -> None:
        """Policies read `view.healthy`; keep it the single flag they need."""
        self.view.healthy = self.up

    def lease(self) -> "Lease":
        """Count one request in flight until the lease is released (exactly once)."""
        self.view.inflight += 1
        self.circuit.on_dispatch()
        return Lease(self)


class Lease:
    """Releasing twice is harmless: the counter can never drift negative or leak."""

    __slots__ = ("_backend",)

    def __init__(self, backend: Backend) -> None:
        self._backend: Backend | None = backend

    def release(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.view.inflight -= 1
            if backend._on_release is not None:
                backend._on_release(backend)

    @property
    def released(self) -> bool:
        return self._backend is None


class Pools:
    """All backends by name and by served model."""

    def __init__(self, backends: Iterable[Backend]) -> None:
        self.by_name: dict[str, Backend] = {}
        self.by_model: dict[str, list[Backend]] = {}
        for b in backends:
            self.by_name[b.name] = b
            self.by_model.setdefault(b.spec.model, []).append(b)

    def models(self) -> list[str]:
        return list(self.by_model)

    def on_release(self, callback: Callable[[Backend], None]) -> None:
        for b in self.by_name.values():
            b._on_release = callback

    @property
    def total_inflight(self) -> int:
        return sum(b.inflight for b in self.by_name.values())

    async def close(self) -> None:
        for b in self.by_name.values():
            await b.client.close()
