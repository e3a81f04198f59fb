"""The gateway's `GET /admin/backends` response as msgspec Structs: the gateway encodes these and
loadgen and the evaluator decode them, so a field renamed on one side fails loudly on the other
instead of silently reading a default."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["AdminBackends", "BackendState", "decode_admin_backends"]


class BackendState(msgspec.Struct, kw_only=True):
    """One backend as the gateway sees it."""

    name: str
    url: str
    model: str
    strategy: str  # "ar" or a speculative strategy, as in the config
    up: bool  # takes new requests if it has room: ready, circuit not open, not draining
    ready: bool  # the last readiness check passed (optimistically True before the first)
    draining: bool
    circuit: str  # "closed", "open" or "half_open"
    inflight: int
    cap: int
    reported_load: dict[str, Any] | None = None  # the backend's own load report, when it has one
    server_info: dict[str, Any] | None = None  # its /server_info, once read
    load_source: str | None = None  # where the load figures came from
    health_checks: int | None = None  # readiness checks done so far; None with no poller
    engine_ok: bool | None = None  # the last SGLang engine check (/health_generate) passed, or none has run
    adapters: list[str] = []  # LoRA adapters loaded there (its /v1/models)
    # its last readiness check came back to this gateway (508): its URL leads here
    loop_detected: bool | None = None

    @property
    def checked(self) -> bool:
        """At least one readiness check has run (the optimistic start-up `ready` is not a result)."""
        return self.health_checks is None or self.health_checks > 0

    @property
    def serving(self) -> bool:
        """Up, by a readiness check that has actually run."""
        return self.up and self.checked


class AdminBackends(msgspec.Struct, kw_only=True):
    """The pool and the gateway's admission counters."""

    inflight: int
    waiting: int
    rejected: int
    retries: int
    access_log_dropped: int
    spans_dropped: int
    policies: dict[str, dict[str, Any]]  # per served model: {"name": policy, ...its own description}
    backends: list[BackendState]
    retiring: list[BackendState] = []  # removed by a reload, finishing their in-flight requests

    def all_serving(self, *, with_server_info: bool = False) -> bool:
        """Every backend serving (and its /server_info read, if asked); False for an empty pool."""
        return bool(self.backends) and all(
            b.serving and (not with_server_info or b.server_info is not None) for b in self.backends
        )


_decoder = msgspec.json.Decoder(AdminBackends)


def decode_admin_backends(body: bytes | str) -> AdminBackends:
    """Decode a `/admin/backends` body; msgspec.ValidationError / DecodeError name what is wrong."""
    return _decoder.decode(body)
