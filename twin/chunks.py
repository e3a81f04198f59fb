"""The bytes of SGLang 0.5.23's OpenAI responses, chunk by chunk.

SGLang writes chat stream chunks two ways, and the twin reproduces both byte for byte:
- role, reasoning, plain content and finish chunks go through `sse_utils.build_sse_content`:
  msgspec structs with `omit_defaults`, so the delta always carries `reasoning_content` (no
  default) and drops `role`/`content` when null, and the chunk drops a null `usage`;
- tool-call chunks, content chunks while the tool-call parser is active, the `sglext` chunk and
  the usage chunk are pydantic `model_dump_json()` of `ChatCompletionStreamResponse`: every field
  in declaration order, `tool_calls` dropped from a delta when null, `sglext` dropped when null.
Completions chunks are pydantic dumps of `CompletionStreamResponse`; the final usage chunk is
dumped with `exclude_none`. Non-stream bodies are `model_dump_json()` of the response models.
Field orders follow `entrypoints/openai/protocol.py` (`UsageInfo`, `SpecTokensDetails`, ...).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

__all__ = [
    "DONE",
    "chat_choice_chunk",
    "chat_choice",
    "chat_delta_chunk",
    "chat_tail_chunk",
    "completion_choice",
    "completion_chunk",
    "completion_response",
    "completion_usage_chunk",
    "response",
    "spec_tokens_details",
    "stream_error_frame",
    "usage_info",
]

DONE = b"data: [DONE]\n\n"
# the headers of every SSE answer the twin sends (chat, completions, Responses, /generate)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_encode = msgspec.json.Encoder().encode


def _frame(body: bytes) -> bytes:
    return b"data: " + body + b"\n\n"


class _StreamDelta(msgspec.Struct, omit_defaults=True):
    reasoning_content: str | None  # no default: always written, as SGLang's StreamDelta
    role: str | None = None
    content: str | None = None


class _StreamChoice(msgspec.Struct):
    index: int
    delta: _StreamDelta
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class _StreamChunk(msgspec.Struct, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[_StreamChoice]
    usage: dict[str, Any] | None = None


def _envelope(
    rid: str, obj: str, created: int, model: str, choices: list[Any], usage: dict[str, Any] | None
) -> dict[str, Any]:
    """The fields every pydantic-dumped response and chunk starts with, in SGLang's order."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, "usage": usage}


def chat_delta_chunk(
    rid: str,
    created: int,
    model: str,
    *,
    role: str | None = None,
    content: str | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
    usage: dict[str, Any] | None = None,
    index: int = 0,
) -> bytes:
    """A chunk as `sse_utils.build_sse_content` writes it."""
    choice = _StreamChoice(index, _StreamDelta(reasoning, role, content), None, finish_reason, matched_stop)
    return _frame(_encode(_StreamChunk(rid, "chat.completion.chunk", created, model, [choice], usage)))


def chat_choice_chunk(
    rid: str,
    created: int,
    model: str,
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    index: int = 0,
) -> bytes:
    """A pydantic-dumped chunk with one choice (tool-call parser path)."""
    delta: dict[str, Any] = {"role": None, "content": content, "reasoning_content": None}
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None, "matched_stop": None}
    return _frame(_encode(_envelope(rid, "chat.completion.chunk", created, model, [choice], usage)))


def chat_tail_chunk(
    rid: str, created: int, model: str, *, usage: dict[str, Any] | None = None, sglext: dict[str, Any] | None = None
) -> bytes:
    """A `choices: []` chunk carrying `sglext` or the final usage (pydantic dump)."""
    body = _envelope(rid, "chat.completion.chunk", created, model, [], usage)
    if sglext is not None:
        body["sglext"] = sglext
    return _frame(_encode(body))


def tool_call_delta(index: int, call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    """One `ToolCall` of a streamed delta (id and name only on the call's first chunk)."""
    return {"id": call_id, "index": index, "type": "function", "function": {"name": name, "arguments": arguments}}


def usage_info(prompt: int, completion: int, reasoning: int = 0, cached: int | None = None) -> dict[str, Any]:
    """`UsageInfo.model_dump()`; `cached` is None unless the server runs --enable-cache-report."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def spec_tokens_details(d: dict[str, Any]) -> dict[str, Any]:
    """`SpecTokensDetails` (9 fields, declaration order) from the engine's spec fields."""
    return {
        "spec_accept_rate": d["spec_accept_rate"],
        "spec_accept_length": d["spec_accept_length"],
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": d["spec_num_correct_drafts"],
        "spec_num_proposed_drafts": d["spec_num_proposed_drafts"],
        "spec_verify_ct": d["spec_verify_ct"],
        "spec_correct_drafts_histogram": d["spec_correct_drafts_histogram"],
        "spec_cap_lens_histogram": [],
    }


def stream_error_frame(message: str, err_type: str, code: int) -> bytes:
    """`data: {"error": ...}` as `create_streaming_error_response` writes it (json.dumps)."""
    body = {"error": {"object": "error", "message": message, "type": err_type, "param": None, "code": code}}
    return _frame(json.dumps(body).encode())


def chat_choice(
    index: int,
    *,
    content: str,
    reasoning: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str | None,
    matched_stop: int | str | None,
    meta_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`ChatCompletionResponseChoice`."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }
    if meta_info is not None:
        choice["meta_info"] = meta_info
    return choice


def response(
    rid: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any],
    sglext: dict[str, Any] | None,
) -> bytes:
    """A non-stream body, `ChatCompletionResponse` or `CompletionResponse` (`obj`) with any number
    of choices: the envelope, `metadata`, then `sglext` when there is one."""
    body = _envelope(rid, obj, created, model, choices, usage)
    body["metadata"] = {"weight_version": "default"}
    if sglext is not None:
        body["sglext"] = sglext
    return _encode(body)


def completion_chunk(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    matched_stop: int | str | None = None,
    usage: dict[str, Any] | None = None,
    index: int = 0,
) -> bytes:
    """`CompletionStreamResponse.model_dump_json()` with one choice."""
    choice = completion_choice(index, text, finish_reason, matched_stop)
    return _frame(_encode(_envelope(rid, "text_completion", created, model, [choice], usage)))


def completion_tail_chunk(rid: str, created: int, model: str, sglext: dict[str, Any]) -> bytes:
    return _frame(_encode({**_envelope(rid, "text_completion", created, model, [], None), "sglext": sglext}))


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    return obj


def completion_usage_chunk(rid: str, created: int, model: str, usage: dict[str, Any]) -> bytes:
    """The final usage chunk, dumped with `exclude_none=True`."""
    return _frame(_encode(_drop_none(_envelope(rid, "text_completion", created, model, [], usage))))


def completion_response(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    matched_stop: int | str | None,
    usage: dict[str, Any],
    sglext: dict[str, Any] | None = None,
) -> bytes:
    """`CompletionResponse.model_dump_json()`."""
    choice = completion_choice(0, text, finish_reason, matched_stop)
    return response(rid, "text_completion", created, model, [choice], usage, sglext)


def completion_choice(
    index: int, text: str, finish_reason: str | None, matched_stop: int | str | None
) -> dict[str, Any]:
    """`CompletionResponseChoice`."""
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }
