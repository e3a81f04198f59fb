"""A request's JSON body as it goes upstream: its top-level values kept as raw JSON.

The gateway reads a few fields to route a request (gateway.openai_request) and passes the rest,
SGLang's extras included, upstream untouched. Decoding a whole body into Python objects costs
several times its size in memory (a 30 MB body of small objects took 0.8 GB); keeping each
top-level value as `msgspec.Raw` (a view of the received bytes) costs one small object per key,
and encoding it again copies those bytes as they are. The gateway's own changes (the backend's
model name, `stream_options`...) are set over them.
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView
from typing import Any

import msgspec

__all__ = ["RequestBody"]

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class RequestBody:
    __slots__ = ("_fields", "_set")

    def __init__(self, fields: dict[str, msgspec.Raw]) -> None:
        self._fields = fields
        self._set: dict[str, Any] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._set or name in self._fields

    def __iter__(self) -> Iterator[str]:
        yield from self._fields
        yield from (k for k in self._set if k not in self._fields)

    def client_fields(self) -> KeysView[str]:
        """The names of the fields the client sent."""
        return self._fields.keys()

    def raw(self, name: str) -> msgspec.Raw | None:
        """The field's JSON as the client sent it (None: absent)."""
        return self._fields.get(name)

    def get(self, name: str) -> Any:
        """The field's value, decoded (None: absent or null); the gateway's own value when it set one."""
        if name in self._set:
            return self._set[name]
        raw = self._fields.get(name)
        return None if raw is None else _decoder.decode(raw)

    def __setitem__(self, name: str, value: Any) -> None:
        """Sets the field for every copy sent from now on (a clamped `priority`, for instance)."""
        self._set[name] = value

    def encode(self, changes: dict[str, Any] | None = None) -> bytes:
        """The body to send: the client's fields, then what was set, then `changes` (this copy only)."""
        if not self._set and not changes:
            return _encoder.encode(self._fields)
        return _encoder.encode({**self._fields, **self._set, **(changes or {})})

    def to_builtins(self) -> dict[str, Any]:
        """The whole body as plain Python values, as it would be sent (tests, diagnostics)."""
        out: dict[str, Any] = _decoder.decode(self.encode())
        return out
