"""The policy contract: pure, synchronous, no I/O, cheap. It runs for every request."""

from __future__ import annotations

import enum
from typing import Protocol, Sequence

import msgspec

from backends import BackendSpec


class Domain(str, enum.Enum):
    MATH = "math"
    CODE = "code"
    CHAT = "chat"


class RequestFeatures(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy may know about a request before it is sent."""

    model: str
    domain: Domain = Domain.CHAT
    prompt_tokens: int = 0
    max_tokens: int | None = None
    stream: bool = False


class BackendView(msgspec.Struct, kw_only=True):
    """A policy's read-only view of one candidate backend at decision time."""

    spec: BackendSpec
    inflight: int = 0  # counted by this gateway, dispatch to stream end
    healthy: bool = True

    @property
    def name(self) -> str:
        return self.spec.name


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The chosen backend plus why, for traces and logs."""

    backend: BackendView
    reason: str
    score: float | None = None


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """Telemetry record of one finished request, fed back to the policy."""

    backend: str
    domain: Domain
    inflight_at_dispatch: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    decode_s: float | None = None  # first to last token
    verify_ct: int | None = None
    accept_length: float | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def decode_tok_s(self) -> float | None:
        if self.decode_s and self.decode_s > 0 and self.completion_tokens > 1:
            return (self.completion_tokens - 1) / self.decode_s
        return None


class NoCandidate(Exception):
    """No backend can take the request (empty pool or none healthy)."""


class Policy(Protocol):
    name: str

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision: ...

    def observe(self, outcome: Outcome) -> None: ...
