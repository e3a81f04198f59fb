"""Finding the backend that holds a stored Response this gateway has no record of.

The gateway's map of which backend stored which Response (gateway.response_owners) lives in one
process: a Response relayed by another replica behind the same balancer, or before this replica
restarted, is not in it. Its backend still has it. SGLang names every Response `resp_` + a UUID
(`ResponsesRequest.request_id`, `entrypoints/openai/protocol.py`), so an id names one Response on
one server, and the backend that answers `GET /v1/responses/{id}` with 200 is the holder.

The lookup asks the candidate backends at once (a follow-up's: those of its own model, resolved
first) and takes the first 200; a backend without the Response answers 404 (or 400 when its store
is off), one that does not answer within `LOOKUP_TIMEOUT_S` is passed over. It runs only for an id
the map does not know (its shape checked first: gateway.response_ids), and what it finds is
recorded, so an id is looked up once. At most `limit` lookups run at once in the gateway: a client
sending unknown ids costs the backends a bounded number of small GETs, and waits its turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from gateway.attempt import NET_ERRORS
from gateway.errors import ApiError
from gateway.pool import Backend
from gateway.response_owners import ResponseOwners

__all__ = ["LOOKUP_TIMEOUT_S", "ResponseLookups", "response_segments"]

LOOKUP_TIMEOUT_S = 2.0


def response_segments(response_id: str, action: str | None = None) -> list[str]:
    """The path of a stored Response on a backend, as segments (`SGLangClient.call` encodes each)."""
    return ["v1", "responses", response_id] if action is None else ["v1", "responses", response_id, action]


class ResponseLookups:
    def __init__(self, owners: ResponseOwners, limit: int = 16, max_bytes: int | None = None) -> None:
        """`limit`: lookups running at once; `max_bytes`: the largest stored Response read."""
        self.owners = owners
        self.limit = limit
        self.max_bytes = max_bytes
        self._slots = asyncio.Semaphore(limit)

    async def find(
        self, response_id: str, backends: Iterable[Backend], *, via: str, timeout_s: float = LOOKUP_TIMEOUT_S
    ) -> tuple[Backend, bytes] | None:
        """The backend holding `response_id` (a checked id) and its answer to the GET, asked of
        every ready backend in `backends` at once; None when none has it. The holder is recorded.
        `via`: the lookups' Via header (gateway.via), so that gateways that are each other's
        backends do not ask each other round and round."""
        asked = [b for b in backends if b.ready]
        if not asked:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise ApiError(
                503,
                f"too many stored-Response lookups under way ({self.limit}); retry the request",
                headers={"Retry-After": "1"},
            ) from None
        try:
            return await self._ask(response_id, asked, via, timeout_s)
        finally:
            self._slots.release()

    async def _ask(
        self, response_id: str, asked: list[Backend], via: str, timeout_s: float
    ) -> tuple[Backend, bytes] | None:
        segments = response_segments(response_id)
        headers = {"Via": via}

        async def ask(backend: Backend) -> tuple[Backend, int, bytes]:
            status, body = await backend.client.call("GET", segments, timeout_s, headers, self.max_bytes)
            return backend, status, body

        tasks = [asyncio.ensure_future(ask(b)) for b in asked]
        try:
            for next_answer in asyncio.as_completed(tasks):
                try:
                    backend, status, body = await next_answer
                except NET_ERRORS:
                    continue
                if status == 200:
                    self.owners.record(response_id, backend.name)
                    return backend, body
            return None
        finally:
            for task in tasks:
                task.cancel()
