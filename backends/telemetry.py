"""Parsing the telemetry SGLang attaches to finished responses: usage and speculative details.

Acceptance length is computed as completion_tokens / spec_verify_ct (SGLang's own definition,
bonus token included): the other spec field names changed across 0.5.x releases, these two did not.
"""

from __future__ import annotations

from typing import Any

import msgspec


class SpecStats(msgspec.Struct, frozen=True):
    verify_ct: int  # summed over the response's sequences
    accept_length: float


class Usage(msgspec.Struct, frozen=True):
    """A response's `usage`. `reasoning_tokens` and `cached_tokens` are None when not reported."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    # OpenAI's `completion_tokens_details.reasoning_tokens`, else SGLang's top-level copy; SGLang
    # counts the thinking segment through its end marker, and sends 0 without a reasoning parser.
    reasoning_tokens: int | None = None
    # `prompt_tokens_details.cached_tokens`: prompt tokens the radix cache served (SGLang sends
    # it only with --enable-cache-report).
    cached_tokens: int | None = None


def spec_stats(sglext: Any, completion_tokens: int) -> SpecStats | None:
    """From a response-level `sglext` object; None when absent or malformed (never raises).

    With `n > 1` (or a completions batch) SGLang sends one details entry per sequence and sums
    `completion_tokens` over them (`entrypoints/openai/usage_processor.py`), so the verify
    counts are summed too: the acceptance length is then the mean over the sequences' passes."""
    if not isinstance(sglext, dict):
        return None
    details = sglext.get("spec_tokens_details")
    entries = details if isinstance(details, list) else [details]
    verify_ct = 0
    for entry in entries:
        count = entry.get("spec_verify_ct") if isinstance(entry, dict) else None
        if type(count) is not int or count <= 0:  # type(): a bool is no count
            return None
        verify_ct += count
    if not verify_ct:
        return None
    return SpecStats(verify_ct=verify_ct, accept_length=completion_tokens / verify_ct)


def usage(obj: Any) -> Usage | None:
    """A `usage` object as decoded JSON; None when absent or malformed (never raises)."""
    if not isinstance(obj, dict):
        return None
    p, c = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if type(p) is not int or type(c) is not int or p < 0 or c < 0:  # type(): a bool is no count
        return None
    reasoning = cached = None
    details = obj.get("completion_tokens_details")
    if details is not None:
        reasoning = _count(details, "reasoning_tokens")
    if reasoning is None and "reasoning_tokens" in obj:
        reasoning = _count(obj, "reasoning_tokens")
    details = obj.get("prompt_tokens_details")
    if details is not None:
        cached = _count(details, "cached_tokens")
    return Usage(prompt_tokens=p, completion_tokens=c, reasoning_tokens=reasoning, cached_tokens=cached)


def _count(obj: Any, name: str) -> int | None:
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if type(value) is int and value >= 0 else None


def responses_usage(obj: Any) -> Usage | None:
    """A Responses API `usage` (`input_tokens`, `output_tokens` and their details, SGLang's
    `ResponsesResponse._serialize_usage` in `entrypoints/openai/protocol.py`); None when absent
    or malformed (never raises)."""
    if not isinstance(obj, dict):
        return None
    p, c = obj.get("input_tokens"), obj.get("output_tokens")
    if type(p) is not int or type(c) is not int or p < 0 or c < 0:
        return None
    return Usage(
        prompt_tokens=p,
        completion_tokens=c,
        reasoning_tokens=_count(obj.get("output_tokens_details"), "reasoning_tokens"),
        cached_tokens=_count(obj.get("input_tokens_details"), "cached_tokens"),
    )
