"""ASGI's callable shapes, shared by the layers the gateway puts in front of litestar: the key gate
(gateway.auth), the generation routes (gateway.fast_routes), the tracing middleware and the answer
sent to the client (gateway.downstream).

Plain mappings, as the ASGI spec has them: the server passes dicts. Litestar types the same objects
with its own TypedDicts, so its app is converted once, where it is wrapped (gateway.app).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["Scope", "Message", "Receive", "Send", "ASGIApp"]
