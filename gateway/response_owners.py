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
    """Bounded by bytes, not by count alone: an id is the client's string (at most 128 characters,
    gateway.response_ids), and a count bound would let long ids take far more memory than short."""

    # What an entry costs beside its strings: the dict slot and the two str objects' headers.
    ENTRY_OVERHEAD = 160

    def __init__(self, capacity: int = 100_000, max_bytes: int = 32 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        self._owners: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._owners

    @classmethod
    def _cost(cls, response_id: str, backend: str) -> int:
        return len(response_id) + len(backend) + cls.ENTRY_OVERHEAD

    def record(self, response_id: str, backend: str) -> None:
        old = self._owners.pop(response_id, None)
        if old is not None:
            self.bytes -= self._cost(response_id, old)
        self._owners[response_id] = backend
        self.bytes += self._cost(response_id, backend)
        while self._owners and (len(self._owners) > self.capacity or self.bytes > self.max_bytes):
            forgotten, holder = self._owners.popitem(last=False)
            self.bytes -= self._cost(forgotten, holder)

    def owner(self, response_id: str) -> str | None:
        backend = self._owners.get(response_id)
        if backend is not None:
            self._owners.move_to_end(response_id)
        return backend
