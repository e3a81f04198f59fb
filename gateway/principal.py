"""Who a request comes from, as far as the gateway's limits go: set by the door (gateway.auth),
read by the request path (the `priority` a client may set)."""

from __future__ import annotations

import msgspec

__all__ = ["Principal"]


class Principal(msgspec.Struct, frozen=True):
    name: str  # an [[auth.clients]] entry's name, "api_key" for a plain key, "anonymous" without keys
    priority_range: tuple[int, int] | None  # the `priority` it may set; None: only the default

    def clamp_priority(self, priority: int, default: int) -> int:
        """`priority` as this principal may set it: into its range, or the default without one."""
        if self.priority_range is None:
            return default
        low, high = self.priority_range
        return min(max(priority, low), high)
