"""A response's token counts (`usage`): one shape and one reader, for the gateway and loadgen.

OpenAI's shape, as SGLang 0.5.23 sends it: `prompt_tokens`, `completion_tokens` (over all of a
request's sequences, reasoning included), `prompt_tokens_details.cached_tokens` (the prefix cache's
share, sent only with `--enable-cache-report`) and `completion_tokens_details.reasoning_tokens`,
which SGLang also copies to a top-level `reasoning_tokens` (counting the thinking segment through
its end marker, and 0 without a reasoning parser). Every field is optional: servers differ, and a
stream's chunks carry usage only with `continuous_usage_stats`. The Responses API's own names
(`input_tokens`, ...) are read into this shape by `common.responses_stream`.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["CompletionTokensDetails", "PromptTokensDetails", "Usage", "usage"]


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int | None = None


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    sglang_reasoning_tokens: int | None = msgspec.field(default=None, name="reasoning_tokens")  # SGLang's copy
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @property
    def reasoning_tokens(self) -> int | None:
        """Reasoning tokens: OpenAI's `completion_tokens_details`, else SGLang's top-level field."""
        d = self.completion_tokens_details
        if d is not None and d.reasoning_tokens is not None:
            return d.reasoning_tokens
        return self.sglang_reasoning_tokens

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens served from the prefix cache, when the server reports them."""
        d = self.prompt_tokens_details
        return d.cached_tokens if d is not None else None


def usage(obj: Any) -> Usage | None:
    """A `usage` object as decoded JSON; None when absent or not of this shape (never raises)."""
    if obj is None:
        return None
    try:
        return msgspec.convert(obj, Usage)
    except msgspec.ValidationError:
        return None
