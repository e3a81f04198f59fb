"""SGLang's `priority` request field: a signed 64-bit integer. Its tokenizer manager refuses any
other value (`srt/managers/tokenizer_manager.py`, `_set_default_priority`), so the gateway and
loadgen refuse it before sending."""

from __future__ import annotations

PRIORITY_MIN = -(1 << 63)
PRIORITY_MAX = (1 << 63) - 1


def priority_in_range(value: int) -> bool:
    return PRIORITY_MIN <= value <= PRIORITY_MAX
