"""Requests turned away at the door, before any request record exists: counted by reason, and
logged as one access-log line each (`"event": "refused"`).

The door is everything in front of the request path: the key gate (gateway/auth.py: 401, 403,
415, 429), the connection limits (gateway/connections.py: 503 at the connection cap, 408 for
headers not sent in time) and the body reader (gateway/generation.py: 413, 408, 503). The body
reader's refusals have a request record already (the access log's `"event": "request"` line, the
requests counter); they are counted here too, so that one series shows every refusal at the door.

Counts are plain integers read at scrape time (gateway/metrics.py), one per (reason, status) of a
fixed set: every series exists from the start, so a first refusal is an increase Prometheus sees.
"""

from __future__ import annotations

import msgspec

from gateway.access_log import AccessLog

__all__ = ["BODY_REASONS", "REASONS", "STATUS", "Refusals"]

# (reason, status) -> counted from the start.
REASONS: tuple[tuple[str, int], ...] = (
    ("missing_key", 401),  # no Authorization: Bearer, where a key is required
    ("invalid_key", 401),  # an API key that is not one of the configured keys
    ("invalid_admin_key", 403),  # the admin API, with a key that is not the admin key
    ("admin_closed", 403),  # the admin API, with no admin key configured
    ("rate_limited", 429),  # the key's rate limit (auth.rate_limit_rps)
    ("unsupported_media_type", 415),  # a POST without Content-Type: application/json
    ("connection_limit", 503),  # gateway.max_connections reached
    ("header_timeout", 408),  # headers not sent within timeouts.client_header_s
    ("body_too_large", 413),  # gateway.max_body_bytes
    ("body_timeout", 408),  # the body not sent within timeouts.client_body_s
    ("body_budget", 503),  # gateway.max_body_bytes_in_flight
    ("bad_request", 400),  # a bad Host or Content-Length header
    ("method_not_allowed", 405),  # a generation route asked with another method than POST
    ("forwarding_loop", 508),  # a request this gateway forwarded before (gateway/via.py)
)
# reason -> the status it is answered with
STATUS: dict[str, int] = dict(REASONS)
# The body reader's refusals (gateway/generation.py) by status: each status names one reason there.
_BODY_READER = ("body_too_large", "body_timeout", "body_budget", "bad_request", "method_not_allowed", "forwarding_loop")
BODY_REASONS: dict[int, str] = {STATUS[reason]: reason for reason in _BODY_READER}
# How much of a client's path a log line repeats.
_PATH_CHARS = 200


class RefusalRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    reason: str
    status: int
    method: str | None = None
    path: str | None = None
    client: str | None = None  # the peer's address: who is knocking


class Refusals:
    def __init__(self, access_log: AccessLog | None = None) -> None:
        self.access_log = access_log
        self.counts: dict[tuple[str, int], int] = dict.fromkeys(REASONS, 0)

    def refused(
        self,
        reason: str,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        client: tuple[str, int] | None = None,
        logged: bool = True,
    ) -> None:
        """Counts one refusal; `logged`: its access-log line too (False: it has a request line)."""
        key = (reason, status)
        if key in self.counts:
            self.counts[key] += 1
        else:  # a pair not in REASONS: a new refusal whose reason was not added there
            self.counts[key] = 1
        if logged and self.access_log is not None:
            self.access_log.event(
                "refused",
                RefusalRecord(
                    reason=reason,
                    status=status,
                    method=method,
                    path=path[:_PATH_CHARS] if path is not None else None,
                    client=client[0] if client else None,
                ),
            )

    def body_refused(self, status: int) -> None:
        """A refusal of the body reader, which wrote its request record already; 499 (the client
        left) is none."""
        reason = BODY_REASONS.get(status)
        if reason is not None:
            self.refused(reason, status, logged=False)
