"""One client request, once read: what it asked for, and what its attempts made of it.

The request is the unit its single record is written from (gateway.ending): its own fields, the
backends it was tried on, and the last attempt's dispatch (where it went, at what load, what came
back). An attempt (gateway.attempt) fills the dispatch when it takes its lease; the proxy reads the
request whole when it ends.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from gateway.errors import ApiError
from gateway.openai_request import Kind, ParsedRequest
from gateway.pool import Backend
from gateway.records import Result
from gateway.suspects import body_fingerprint
from gateway.tracing import ClientSpan, Trace
from policies import Decision, Policy, RequestFeatures

__all__ = ["BACKEND_HEADER", "REQUEST_ID_HEADER", "TRACE_ID_HEADER", "Request", "request_id_of"]

REQUEST_ID_HEADER = "x-request-id"  # the client's id for its request, else one the gateway makes
BACKEND_HEADER = "x-specroute-backend"  # a backend the client pins; the backend that answered
TRACE_ID_HEADER = "x-specroute-trace-id"  # the trace that recorded the request
_getrandbits = random.getrandbits


class Request:
    __slots__ = (
        "kind",
        "headers",
        "request_id",
        "trace",
        "trace_id",
        "t_received",
        "parsed",
        "raw",
        "model",
        "pin",
        "adapter",
        "adapters",
        "features",
        "policy",
        "tried",
        "queue_s",
        "looped",
        "last_error",
        "request_errors",
        "backend",
        "decision",
        "inflight",
        "t_dispatch",
        "mean_inflight",
        "span",
        "result",
        "shut_down",
        "_fingerprint",
    )

    def __init__(
        self,
        kind: Kind,
        headers: Mapping[str, str],
        request_id: str,
        trace: Trace | None,
        t_received: float,
        parsed: ParsedRequest,
        raw: bytes,
        model: str,
        pin: str | None,
        features: RequestFeatures,
        policy: Policy,
        adapter: str | None = None,
    ) -> None:
        self.kind = kind
        self.headers = headers
        self.request_id = request_id
        self.trace = trace
        self.trace_id = trace.trace_id if trace is not None else None
        self.t_received = t_received
        self.parsed = parsed
        self.raw = raw  # the body as it came
        self.model = model
        self.pin = pin
        # The LoRA adapter named in `model` (sent upstream as `lora_path`), and every adapter the
        # backend must have loaded: that one, or those the body's `lora_path` names.
        self.adapter = adapter
        self.adapters = frozenset((adapter,)) if adapter is not None else parsed.lora_paths
        self.features = features
        self.policy = policy
        # Its attempts so far.
        self.tried: list[str] = []  # backends attempted, in order
        self.queue_s = 0.0  # waiting for capacity, over all attempts
        # Backends this request came back from (508, gateway.via), with the error it got there:
        # never tried again for it, as it would come back again.
        self.looped: dict[str, ApiError] | None = None
        self.last_error: ApiError | None = None  # the last failed attempt's, for when no retry may follow
        self.request_errors = 0  # attempts that failed with the request's own error (a 500)
        # The last attempt's dispatch (`dispatched`): its backend, the policy's decision, the load
        # there with it (in sequences), when it went, the time-weighted load over its life.
        self.backend: Backend | None = None
        self.decision: Decision | None = None
        self.inflight = 0
        self.t_dispatch = 0.0
        self.mean_inflight: float | None = None
        self.span: ClientSpan | None = None  # its CLIENT span, until a record ends it
        self.result = Result()  # what came back, filled as it arrives
        self.shut_down = False  # ended by the gateway's shutdown, not by its client or its backend
        self._fingerprint: int | None = None

    def dispatched(self, backend: Backend, decision: Decision, span: ClientSpan | None, t_dispatch: float) -> None:
        """An attempt took its lease on `backend`: from here the request's record tells of it."""
        self.tried.append(backend.name)
        self.backend, self.decision, self.span, self.t_dispatch = backend, decision, span, t_dispatch
        self.inflight = backend.inflight
        self.mean_inflight = None
        self.result = Result()

    @property
    def fingerprint(self) -> int:
        """The body's identity for the quarantine (gateway.suspects): the same request sent again,
        however its JSON is spaced or its keys ordered. Computed on first use, which only a failure
        or a quarantine in force asks for."""
        if self._fingerprint is None:
            self._fingerprint = body_fingerprint(self.raw)
        return self._fingerprint


def request_id_of(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` when it is a sane one, else a new random id."""
    rid = headers.get(REQUEST_ID_HEADER)
    if rid and len(rid) <= 128 and rid.isprintable():
        return rid
    # getrandbits, not os.urandom: a request id is not a secret, and urandom's syscall releases the
    # GIL, which another thread (the access-log writer) may then hold for a switch interval.
    return _getrandbits(128).to_bytes(16, "big").hex()
