"""The gateway's `Via` header, and the forwarding loops it stops.

RFC 9110 §7.6.3 asks a gateway to add a `Via` entry to each request it forwards. Each process
names itself with a pseudonym drawn at start (`VIA_ENTRY`), so a request that comes back to the
process that forwarded it can be told apart from any other. That happens when a backend's URL
points at this gateway (its own port, where SGLang's was meant), or at another gateway that
forwards to this one. Forwarded again, such a request would take a slot and a connection at
every hop until the admission limits refused it. It is answered `508 Loop Detected` instead
(RFC 5842 §7.2), naming the gateway that found the loop. The hop that sent it never sends the
request there again (gateway.attempt): if the loop closed at that hop, the backend leads back to
it (its failure; a readiness check answered 508 takes it out at once), else the 508 is passed
back to the gateway it names.

An incoming `Via` is kept and this gateway's entry appended, so a loop through several gateways
is caught too. The polls and lookups this gateway starts itself carry its entry alone.
"""

from __future__ import annotations

import secrets

from gateway.errors import ApiError

__all__ = ["LOOP_STATUS", "VIA_ENTRY", "forwarded_via", "forwarding_loop", "has_looped"]

LOOP_STATUS = 508
# "1.1" is the protocol the request came in on to this hop, as RFC 9110's Via syntax wants; the
# received-by part is a pseudonym, since the host and port a client used need not be this one's.
VIA_ENTRY = f"1.1 specroute-{secrets.token_hex(6)}"


def forwarded_via(incoming: str | None) -> str:
    """The `Via` to send upstream with a request that came in with `incoming` (None: none)."""
    return f"{incoming}, {VIA_ENTRY}" if incoming else VIA_ENTRY


def has_looped(incoming: str | None) -> bool:
    """This gateway forwarded the request before: its entry is in the `Via` it came with."""
    return incoming is not None and VIA_ENTRY in incoming


def forwarding_loop() -> ApiError:
    """The 508; it names this gateway's entry, so the gateway it goes back to can tell whether the
    loop closed at itself (gateway.attempt)."""
    return ApiError(
        LOOP_STATUS,
        f"this gateway ({VIA_ENTRY}) forwarded this request before (its Via header names it): "
        "a backend's URL leads back here",
        code="loop_detected",
    )
