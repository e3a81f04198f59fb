"""One log line for every action taken through the admin API: who, from where, what, the outcome.

On the `specroute.audit` logger, at INFO, which is enabled whatever `logging.level` says: an
operator must be able to see who changed the pool without turning on every other INFO line.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["audit"]

log = logging.getLogger("specroute.audit")
log.setLevel(logging.INFO)


def audit(action: str, *, client: Any, credential: str, status: int) -> None:
    """`action`: method and path; `client`: the ASGI scope's (host, port); `credential`: how it
    was let in; `status`: the answer's (0: none was sent)."""
    where = f"{client[0]}:{client[1]}" if isinstance(client, (list, tuple)) and len(client) == 2 else "unknown"
    log.info("admin %s by %s from %s: %d", action[:200], credential, where, status)
