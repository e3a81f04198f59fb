"""Requests suspected of crashing the servers they reach ("queries of death"), in bounded memory.

A backend that dies or stops stepping while it serves a request loses that request too, and the
gateway retries it elsewhere: right for a server that failed on its own, ruinous for a request that
made it fail (a body that crashes the engine would take down every backend it is retried on, and
then, as the client's SDK retries it, the rest). So each request body that was in flight on a
backend that failed under it is remembered, by a hash of its JSON (`body_fingerprint`: whitespace
and key order aside), with the backends that failed under it. Once `after` distinct backends have,
it is neither retried nor accepted again for `for_s` seconds: two servers failing with one request
in flight is unlikely to be chance, and costs two servers, not the pool. Distinct backends, because
many clients send the same body (a benchmark's prompt, a greeting): one server crashing under
twenty copies of it says nothing about the body.

The memory is a least-recently-used table of at most `capacity` entries, each expiring `for_s`
seconds after its last failure. The common case, no suspect at all, costs one `len` per request."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from common.json_errors import JSON_DECODE_ERRORS

__all__ = ["Suspects", "body_fingerprint"]

_decoder = msgspec.json.Decoder()
_sorted_encoder = msgspec.json.Encoder(order="sorted")


def body_fingerprint(raw: bytes) -> int:
    """A request body's identity: the same request, however its JSON is spaced or its keys are
    ordered (one extra space must not let a query of death past its quarantine)."""
    try:
        return hash(_sorted_encoder.encode(_decoder.decode(raw)))
    except JSON_DECODE_ERRORS:  # not JSON (never parsed): its bytes are all it is
        return hash(raw)


class Suspects:
    def __init__(
        self,
        after: int = 2,
        for_s: float = 600.0,
        capacity: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`after`: distinct backends failing under one request before it is refused (0: never)."""
        if after < 0 or for_s < 0 or capacity < 1:
            raise ValueError("Suspects needs after >= 0, for_s >= 0 and capacity >= 1")
        self.after = after
        self.for_s = for_s
        self.capacity = capacity
        self._clock = clock
        # body hash -> (the backends that failed under it, expiry)
        self._entries: OrderedDict[int, tuple[frozenset[str], float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def failed_under(self, fingerprint: int, backend: str) -> int:
        """`backend` failed while serving the request: how many distinct backends have."""
        now = self._clock()
        backends, expiry = self._entries.pop(fingerprint, (frozenset(), 0.0))
        if expiry <= now:
            backends = frozenset()
        if len(backends) < max(self.after, 1):  # no need to remember more than decide
            backends |= {backend}
        self._entries[fingerprint] = (backends, now + self.for_s)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return len(backends)

    def refused_for(self, fingerprint: int) -> float:
        """Seconds the request is still refused for; 0.0 when it may go to a backend."""
        entry = self._entries.get(fingerprint)
        if entry is None:
            return 0.0
        backends, expiry = entry
        left = expiry - self._clock()
        if left <= 0:
            del self._entries[fingerprint]
            return 0.0
        return left if self.after and len(backends) >= self.after else 0.0
