"""How long an answer runs before the model ends it with EOS: one pure function of (model, domain, key).

A real server stops a request at the first of: EOS, a stop string, `max_tokens`. A client that
sends `ignore_eos` (SGLang's `bench_serving` does, unless `--disable-ignore-eos`, and so does
loadgen) gets exactly `max_tokens`; any other client gets the model's own answer length, which
the gateway cannot know in advance and learns from the answers it relays
(`policies.lengths.OutputLengths`). The twin stops such a request after `answer_tokens` content
tokens (after any reasoning), with SGLang's `finish_reason: "stop"` and the EOS token as
`matched_stop`.

Lengths are log-normal per domain around a median (`[answer]` in a profile), drawn from the
prompt key, so one prompt always gets the same length. The medians are assumptions (no published
per-domain answer-length table for Kimi K2.6 or Qwen3.6 was found), set around the roughly 512
tokens per request of the studies' sweeps; the log-normal shape is the usual fit of answer
lengths in chat logs.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from twin.thinking import lognormal_tokens

__all__ = ["AnswerModel", "answer_tokens", "natural_stop"]

# Decorrelates the answer's draw from the reasoning length's, which comes from the same key.
_SALT = 0xA5A5_5A5A_C3C3_3C3C


class AnswerModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The median answer (content) tokens per domain, and the log-normal's sigma."""

    math: Annotated[int, msgspec.Meta(ge=0)] = 0
    code: Annotated[int, msgspec.Meta(ge=0)] = 0
    chat: Annotated[int, msgspec.Meta(ge=0)] = 0
    spread: Annotated[float, msgspec.Meta(ge=0.0, le=3.0)] = 0.0  # sigma of the log-normal (0: the median)


def answer_tokens(model: AnswerModel | None, domain: str, key: int) -> int | None:
    """Content tokens after which the model emits EOS for a prompt of `domain` with prompt key
    `key`; None when the profile states no answer length (the answer runs to its budget)."""
    if model is None:
        return None
    median = getattr(model, domain, 0)
    if median <= 0:
        return None
    return lognormal_tokens(median, model.spread, key ^ _SALT)


def natural_stop(
    model: AnswerModel | None, domain: str, key: int, reasoning_tokens: int = 0, ignore_eos: bool = False
) -> int | None:
    """Output tokens after which the request ends at EOS: its reasoning, then its answer; None
    when it runs to its budget (the client ignores EOS, or the profile has no answer lengths)."""
    if ignore_eos:
        return None
    answer = answer_tokens(model, domain, key)
    return reasoning_tokens + answer if answer is not None else None
