"""Served model -> pool of backends, and the gateway's own in-flight accounting."""

from __future__ import annotations

from typing import Iterable

from backends import BackendSpec
from backends.client import SGLangClient
from backends.loads import LoadReport, ServerInfo
from policies import BackendView


class Backend:
    """One upstream as the gateway runs it: client, live view for policies, in-flight counter."""

    __slots__ = ("spec", "client", "view", "info", "load")

    def __init__(self, spec: BackendSpec, client: SGLangClient) -> None:
        self.spec = spec
        self.client = client
        self.view = BackendView(spec=spec)
        self.info: ServerInfo | None = None  # from /server_info, once
        self.load: LoadReport | None = None  # latest backend-reported load

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def inflight(self) -> int:
        return self.view.inflight

    def lease(self) -> "Lease":
        """Count one request in flight until the lease is released (exactly once)."""
        self.view.inflight += 1
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
        self.views: dict[str, list[BackendView]] = {m: [b.view for b in bs] for m, bs in self.by_model.items()}

    def models(self) -> list[str]:
        return list(self.by_model)

    async def close(self) -> None:
        for b in self.by_name.values():
            await b.client.close()
