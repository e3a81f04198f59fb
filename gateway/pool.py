"""Served model -> pool of backends, the gateway's own in-flight accounting, and who may take a request.

A backend takes new requests when it is ready (poller), its circuit allows it, it is not being
drained, and it is below its in-flight cap. In-flight is counted from dispatch to stream end,
error or disconnect by a `Lease` that releases exactly once.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from backends import BackendSpec
from backends.client import SGLangClient
from backends.loads import LoadReport, ServerInfo
from gateway.circuit import CircuitBreaker
from policies import BackendView


class Backend:
    """One upstream as the gateway runs it: client, live view for policies, health, in-flight."""

    __slots__ = (
        "spec",
        "client",
        "view",
        "info",
        "adapters",
        "leases",
        "load",
        "circuit",
        "ready",
        "draining",
        "cap_override",
        "address",
        "loop_reported",
        "_on_release",
        "_area",
        "_area_t",
    )

    def __init__(
        self, spec: BackendSpec, client: SGLangClient, circuit: CircuitBreaker | None = None, cap: int = 0
    ) -> None:
        self.spec = spec
        self.client = client
        self.view = BackendView(spec=spec)
        self.info: ServerInfo | None = None  # from /server_info, once
        # LoRA adapters loaded there (its /v1/models, re-read every health.models_refresh_s)
        self.adapters: frozenset[str] = frozenset()
        self.leases: set[Lease] = set()  # held here now: requests in flight, background Responses
        self.load: LoadReport | None = None  # latest backend-reported load
        self.circuit = circuit or CircuitBreaker()
        self.ready = True  # optimistic until the first readiness check says otherwise
        self.draining = False  # no new requests; in-flight ones finish
        self.cap_override = cap  # 0: use the backend's own max_running_requests once known
        parts = urlsplit(spec.url)
        self.address: tuple[str, int | None] = (parts.hostname or spec.url, parts.port)
        self.loop_reported = False  # a request sent here came back (gateway.via): logged once
        self._on_release: Callable[[Backend], None] | None = None
        # in-flight integrated over time, for each request's time-weighted mean load
        self._area = 0.0
        self._area_t = time.perf_counter()

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
        if self.info is not None and self.info.max_running_requests:
            return self.info.max_running_requests
        # SGLang 0.5.23 leaves /server_info's max_running_requests null on AR servers started
        # without the flag; /v1/loads reports the effective one.
        return self.view.max_running or 0

    @property
    def up(self) -> bool:
        """Could take traffic if it had room: ready, circuit not open, not draining."""
        return self.ready and not self.draining and self.circuit.allows()

    @property
    def serving(self) -> bool:
        """Ready and not draining, whatever its circuit says: what panic routing falls back to."""
        return self.ready and not self.draining

    def has_room_for(self, sequences: int) -> bool:
        """Its cap (in sequences) can take `sequences` more; an idle backend takes a request of any
        size, which otherwise no backend could ever run."""
        cap, inflight = self.cap, self.view.inflight
        return cap == 0 or inflight == 0 or inflight + sequences <= cap

    def refresh_view(self, candidate: bool = False) -> None:
        """Policies read `view.healthy`; keep it the single flag they need. `candidate`: admission
        offers it for a request (it is up, or serving while its model is in panic: gateway.admission)."""
        self.view.healthy = self.serving if candidate else self.up

    def inflight_area(self, now: float) -> float:
        """Integral of in-flight over time up to `now` (request-seconds)."""
        return self._area + self.view.inflight * (now - self._area_t)

    def _advance(self) -> None:
        now = time.perf_counter()
        self._area = self.inflight_area(now)
        self._area_t = now

    def stalled(self) -> int:
        """The backend stopped stepping: every lease whose holder can give it up now does
        (`Lease.on_stall`, gateway.attempt): a request still waiting for its answer is tried on
        another backend, a stream under way ends with an error event rather than waiting out its
        idle deadline. Returns how many."""
        given_up = [lease for lease in self.leases if lease.on_stall is not None]
        for lease in given_up:
            stall, lease.on_stall = lease.on_stall, None
            if stall is not None:
                stall()
        return len(given_up)

    def lease(self, sequences: int = 1) -> Lease:
        """Count a request's sequences in flight until the lease is released (exactly once). In
        sequences, as SGLang's running count and `max_running_requests` are: `n` > 1 runs n."""
        self._advance()
        self.view.inflight += sequences
        lease = Lease(self, sequences, self.circuit.on_dispatch())
        self.leases.add(lease)
        return lease


class Lease:
    """Releasing twice is harmless: the counter can never drift negative or leak.

    `on_stall`: what its holder does when the backend stops stepping (`Backend.stalled`), set only
    while giving the request up is possible (None: it runs on)."""

    __slots__ = ("_backend", "_sequences", "probe", "on_stall")

    def __init__(self, backend: Backend, sequences: int = 1, probe: bool = False) -> None:
        self._backend: Backend | None = backend
        self._sequences = sequences
        self.probe = probe  # the request is its backend's half-open circuit's probe
        self.on_stall: Callable[[], None] | None = None

    def release(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            self.on_stall = None
            backend.leases.discard(self)
            backend._advance()
            backend.view.inflight -= self._sequences
            if backend._on_release is not None:
                backend._on_release(backend)


class Pools:
    """All backends by name and by served model. Backends can be added and removed at runtime
    (hot reload, admin API): a removed backend leaves the pools at once, so it gets no new
    request, while leases it already handed out still release against it."""

    def __init__(self, backends: Iterable[Backend] = (), max_ejected_share: float = 0.5) -> None:
        self.by_name: dict[str, Backend] = {}
        self.by_model: dict[str, list[Backend]] = {}
        # At most this share of a model's backends may have their circuit open (at least one).
        self.max_ejected_share = max_ejected_share
        # Models served even with no backend: those with a discovered entry (gateway/discovery.py), by
        # how many; and, for such a model with none, why (the 503 for it says so).
        self.kept: collections.Counter[str] = collections.Counter()
        self.why_empty: dict[str, str] = {}
        self._on_release: Callable[[Backend], None] | None = None
        for b in backends:
            self.add(b)

    def models(self) -> list[str]:
        return list(self.by_model)

    def add(self, backend: Backend) -> None:
        if backend.name in self.by_name:
            raise ValueError(f"backend {backend.name!r} exists already")
        backend._on_release = self._on_release
        backend.circuit.may_open = lambda: self.may_eject(backend)
        self.by_name[backend.name] = backend
        self.by_model.setdefault(backend.spec.model, []).append(backend)

    def remove(self, name: str) -> Backend:
        backend = self.by_name.pop(name)
        members = self.by_model[backend.spec.model]
        members.remove(backend)
        if not members and backend.spec.model not in self.kept:
            del self.by_model[backend.spec.model]
        return backend

    def keep(self, model: str) -> None:
        """`model` stays served with no backend (a discovered entry of it may have no member)."""
        self.kept[model] += 1
        self.by_model.setdefault(model, [])

    def release(self, model: str) -> None:
        """Undoes one `keep`; a model with no backend then leaves."""
        self.kept[model] -= 1
        if self.kept[model] <= 0:
            del self.kept[model]
            self.why_empty.pop(model, None)
            if not self.by_model.get(model, True):
                del self.by_model[model]

    def may_eject(self, backend: Backend) -> bool:
        """Whether `backend`'s circuit may open: fewer of its model's backends are ejected than
        the share allows (Envoy's max_ejection_percent; one at least, as Envoy ejects one host
        whatever the percentage). A backend out of the pool anyway (not ready, draining) does not
        count: its circuit keeps nothing out."""
        members = self.by_model.get(backend.spec.model, [])
        allowed = max(1, math.floor(self.max_ejected_share * len(members)))
        ejected = sum(1 for b in members if b is not backend and b.serving and b.circuit.ejected)
        return ejected < allowed

    def on_release(self, callback: Callable[[Backend], None]) -> None:
        self._on_release = callback
        for b in self.by_name.values():
            b._on_release = callback

    async def close(self) -> None:
        for b in self.by_name.values():
            await b.client.close()
