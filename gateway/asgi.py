"""ASGI's callable shapes, shared by the layers the gateway puts in front of litestar: the key gate
(gateway.auth), the generation routes (gateway.fast_routes), the tracing middleware and the answer
sent to the client (gateway.downstream).

Plain mappings, as the ASGI spec has them: the server passes dicts. Litestar types the same objects
with its own TypedDicts, so its app is converted once, where it is wrapped (gateway.app).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

from litestar.utils import normalize_path

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["Scope", "Message", "Receive", "Send", "ASGIApp", "routed_path"]


def routed_path(scope: Scope) -> str:
    """The path as litestar's router matches it: without the root_path, slashes normalised
    (`//admin/backends` is `/admin/backends`). What decides a route must be decided on this path,
    not on the raw one."""
    path: str = scope["path"]
    if root_path := scope.get("root_path", ""):
        path = path.split(root_path, maxsplit=1)[-1]
    elif path[:1] == "/" and "//" not in path and (len(path) == 1 or path[-1] != "/"):
        return path  # already normal: the usual request, without normalize_path's regex (5k instructions)
    return normalize_path(path)
