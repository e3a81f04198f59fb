"""Parsing the speculative details SGLang attaches to finished responses (`sglext`); their usage
is read by `common.usage`.

Acceptance length is computed as completion_tokens / spec_verify_ct (SGLang's own definition,
bonus token included): the other spec field names changed across 0.5.x releases, these two did not.
"""

from __future__ import annotations

from typing import Any

import msgspec


class SpecStats(msgspec.Struct, frozen=True):
    verify_ct: int  # summed over the response's sequences
    accept_length: float


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
