"""Which backend holds each stored Response, so that what refers to one goes where it is.

With `--enable-response-store`, SGLang keeps a Response in the memory of the server that made it
(`entrypoints/openai/serving_responses.py`, `response_store` and `msg_store`): a follow-up with
`previous_response_id`, `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` work only
there. The gateway remembers the backend of every Response it relayed that asked to be stored
(`store`, true by default), in bounded memory: the least recently used are forgotten first.
A backend that restarted has lost its store, but no other has it either, so nothing is forgotten
on a restart: the follow-up still goes to the one place that could answer it.

A client may name the Response it asks for (`request_id`, `protocol.py: ResponsesRequest`). A name
this map holds already is refused (409): taking it would move the id's owner, and send the
follow-ups of whoever made the first one into the second's conversation.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["ResponseOwners"]


class ResponseOwners:
    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._owners

    def record(self, response_id: str, backend: str) -> None:
        self._owners[response_id] = backend
        self._owners.move_to_end(response_id)
        if len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def owner(self, response_id: str) -> str | None:
        backend = self._owners.get(response_id)
        if backend is not None:
            self._owners.move_to_end(response_id)
        return backend
