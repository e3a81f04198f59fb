"""Finding the backend that holds a stored Response this gateway has no record of.

The gateway's map of which backend stored which Response (gateway.response_owners) lives in one
process: a Response relayed by another replica behind the same balancer, or before this replica
restarted, is not in it. Its backend still has it. SGLang names every Response `resp_` + a UUID
(`ResponsesRequest.request_id`, `entrypoints/openai/protocol.py`), so an id names one Response on
one server, and the backend that answers `GET /v1/responses/{id}` with 200 is the holder.

The lookup asks every ready backend at once and takes the first 200; a backend without the
Response answers 404 (or 400 when its store is off), one that does not answer within
`LOOKUP_TIMEOUT_S` is passed over. It runs only for an id the map does not know, and what it finds
is recorded, so an id is looked up once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from gateway.attempt import NET_ERRORS
from gateway.errors import ApiError
from gateway.pool import Backend
from gateway.response_owners import ResponseOwners

__all__ = ["LOOKUP_TIMEOUT_S", "check_response_id", "find_holder"]

LOOKUP_TIMEOUT_S = 2.0
ID_PREFIX = "resp_"  # SGLang refuses any other id (`serving_responses.py: retrieve_responses`)


def check_response_id(response_id: str) -> None:
    """SGLang's answer to an id that cannot be one of its Responses, given without asking it."""
    if not response_id.startswith(ID_PREFIX):
        raise ApiError(
            400,
            f"Invalid 'response_id': {response_id!r}. Expected an ID that begins with 'resp'.",
            param="response_id",
        )


async def find_holder(
    response_id: str,
    backends: Iterable[Backend],
    owners: ResponseOwners,
    timeout_s: float = LOOKUP_TIMEOUT_S,
    *,
    via: str,
) -> tuple[Backend, bytes] | None:
    """The backend holding `response_id` and its answer to the GET, asked of every ready backend
    at once; None when none has it. The holder is recorded in `owners`. `via`: the lookups' Via
    header (gateway.via), so that gateways that are each other's backends do not ask each other
    round and round."""
    asked = [b for b in backends if b.ready]
    if not asked or not response_id.startswith(ID_PREFIX):
        return None
    path = f"/v1/responses/{response_id}"  # the client's encodes it (`SGLangClient.call`)
    headers = {"Via": via}

    async def ask(backend: Backend) -> tuple[Backend, int, bytes]:
        status, body = await backend.client.call("GET", path, timeout_s, headers)
        return backend, status, body

    tasks = [asyncio.ensure_future(ask(b)) for b in asked]
    try:
        for next_answer in asyncio.as_completed(tasks):
            try:
                backend, status, body = await next_answer
            except NET_ERRORS:
                continue
            if status == 200:
                owners.record(response_id, backend.name)
                return backend, body
        return None
    finally:
        for task in tasks:
            task.cancel()
