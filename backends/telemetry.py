"""Parsing the telemetry SGLang attaches to finished responses.

Acceptance length is computed as completion_tokens / spec_verify_ct (SGLang's own definition,
bonus token included): the other spec field names changed across 0.5.x releases, these two did not.
"""

from __future__ import annotations

from typing import Any

import msgspec


class SpecStats(msgspec.Struct, frozen=True):
    verify_ct: int
    accept_length: float


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0


def spec_stats(sglext: Any, completion_tokens: int) -> SpecStats | None:
    """From a response-level `sglext` object; None when absent or malformed (never raises)."""
    if not isinstance(sglext, dict):
        return None
    details = sglext.get("spec_tokens_details")
    if isinstance(details, list):  # n > 1: one entry per choice; the first is representative
        details = details[0] if details else None
    if not isinstance(details, dict):
        return None
    verify_ct = details.get("spec_verify_ct")
    if not isinstance(verify_ct, int) or isinstance(verify_ct, bool) or verify_ct <= 0:
        return None
    return SpecStats(verify_ct=verify_ct, accept_length=completion_tokens / verify_ct)


def usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    p, c = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if not isinstance(p, int) or not isinstance(c, int):
        return None
    return Usage(prompt_tokens=p, completion_tokens=c)
