"""LoRA adapters as SGLang names them in a request: `"model": "base:adapter"`, or `lora_path`.

SGLang 0.5.23 serves an adapter when the request's `model` is its served name, a colon and the
adapter's name, or when the body's `lora_path` names one (the model parameter wins:
`entrypoints/openai/serving_base.py`, `_parse_model_parameter` and `_resolve_lora_path`). The
gateway reads both the same way, over its own model names, and sends a request only to backends
whose `/v1/models` lists every adapter it needs.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gateway.errors import ApiError

__all__ = ["requested_lora_paths", "split_model"]


def split_model(model: str, served: Collection[str]) -> tuple[str, str | None]:
    """(base model, adapter or None). An exact served name wins, colons and all; else the longest
    served name followed by `:` is the base and the rest, stripped, the adapter (empty: none). A
    name no served model prefixes comes back whole, for the caller's 404."""
    if model in served or ":" not in model:
        return model, None
    bases = [m for m in served if model.startswith(m + ":")]
    if not bases:
        return model, None
    base = max(bases, key=len)
    return base, model[len(base) + 1 :].strip() or None


def requested_lora_paths(value: Any) -> frozenset[str]:
    """The adapters a body's `lora_path` (`value`) names: one name, or one per prompt of a batch
    (null entries: the base model)."""
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset((value,)) if value else frozenset()
    if isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
        return frozenset(v for v in value if v)
    raise ApiError(400, "'lora_path' must be a string or an array of strings", param="lora_path")
