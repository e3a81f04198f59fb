"""The JSON SGLang 0.5.23's `/v1/responses` writes: the response object, its items, usage, and the
SSE events of a streamed response, built from one turn's tokens as the chat route builds chunks.

Shapes follow `entrypoints/openai/protocol.py` (`ResponsesResponse`, its `_serialize_usage`,
`from_request`) and the openai 2.8.0 pydantic types SGLang builds from (it pins `openai==2.8.0`):
every field is dumped, nulls included, in declaration order (openai's event models declare theirs
alphabetically). `ResponseEvents` replays `serving_responses._responses_stream_generator_non_harmony`
for a text answer: the reasoning parser's split opens a `reasoning` item, normal text a `message`
item, each closed before the next opens, every event numbered by `sequence_number` from 0.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

__all__ = [
    "ECHOABLE_REASONING_EFFORTS",
    "ResponseEvents",
    "drop_none",
    "message_item",
    "reasoning_item",
    "response_error",
    "response_object",
    "responses_usage",
    "status_from_finish",
]

_encode = msgspec.json.Encoder().encode

# `protocol.py: ECHOABLE_REASONING_EFFORTS`: the efforts a response echoes; others echo null
ECHOABLE_REASONING_EFFORTS = frozenset({"minimal", "low", "medium", "high"})


def _uuid() -> str:
    """`utils/common.py: random_uuid` (32 hex)."""
    return uuid.uuid4().hex


def drop_none(obj: Any) -> Any:
    """`model_dump(exclude_none=True)`, as `msg_store` keeps a response's output items."""
    if isinstance(obj, dict):
        return {k: drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_none(v) for v in obj]
    return obj


def responses_usage(prompt: int, completion: int, reasoning: int, cached: int) -> dict[str, Any]:
    """`ResponsesResponse._serialize_usage`: the Responses shape of the chat `UsageInfo`. The serving
    class is built with `enable_prompt_tokens_details=True` (`http_server.py`), so `cached_tokens`
    is reported without `--enable-cache-report`; `cache_write_tokens` is always 0."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def status_from_finish(reason: str | None) -> str:
    """`serving_responses._status_from_finish_reason`: length -> incomplete, abort -> failed."""
    if reason == "length":
        return "incomplete"
    if reason in ("abort", "error"):
        return "failed"
    return "completed"


def _output_text(text: str) -> dict[str, Any]:
    """openai `ResponseOutputText` (logprobs are not modelled: always null)."""
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """SGLang's `ResponseOutputMessage` (openai's plus `phase`); `text` None: no content yet (the
    item as `output_item.added` announces it). `phase` is "final_answer" (no tool calls)."""
    content = [] if text is None else [_output_text(text)]
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": "final_answer",
    }


def reasoning_item(item_id: str, text: str | None, status: str, summary: bool) -> dict[str, Any]:
    """`serving_responses._make_reasoning_item`: the trace in `content` (and mirrored into `summary`
    when `reasoning.summary` is set); `encrypted_content` null (not modelled). `text` None: the
    empty item of `output_item.added`."""
    parts = [] if text is None else [{"text": text, "type": "reasoning_text"}]
    summaries = [{"text": text, "type": "summary_text"}] if summary and text is not None else []
    return {
        "id": item_id,
        "summary": summaries,
        "type": "reasoning",
        "content": parts,
        "encrypted_content": None,
        "status": status,
    }


def _is_text_only(output: list[dict[str, Any]]) -> bool:
    """`ResponsesResponse.from_request._is_text_only`: no items, or any reasoning item, is not."""
    return bool(output) and all(item.get("type") == "message" for item in output)


def response_object(
    echo: dict[str, Any],
    rid: str,
    created: int,
    model: str | None,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`ResponsesResponse.from_request(...)` dumped, field order of `protocol.py`. `echo` carries the
    request's echoed fields (responses_api.py builds it once per request); `text` is the request's
    `text` or, for a text-only output, `{"format": {"type": "text"}}`, else null."""
    text = (
        echo["text"] if echo["text"] is not None else ({"format": {"type": "text"}} if _is_text_only(output) else None)
    )
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "output": output,
        "status": status,
        "usage": usage,
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "tool_choice": echo["tool_choice"],
        "tools": echo["tools"],
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo["instructions"],
        "max_output_tokens": echo["max_output_tokens"],
        "previous_response_id": echo["previous_response_id"],
        "reasoning": {"effort": echo["effort"], "summary": None},
        "store": echo["store"],
        "temperature": echo["temperature"],
        "text": text,
        "top_p": echo["top_p"],
        "truncation": echo["truncation"],
        "user": echo["user"],
        "metadata": echo["metadata"],
    }


def response_error(message: str | None) -> dict[str, Any]:
    """`serving_responses._error_from_finish_reason`: a failed (aborted) generation's `error`."""
    return {"code": "server_error", "message": message or "Generation aborted"}


class ResponseEvents:
    """The SSE events of one streamed response, in SGLang's order, with `sequence_number`s.

    Feed it each engine step's (reasoning, normal text) split with `step`; `close` ends the open
    items; `lifecycle` writes response.created / in_progress / completed / incomplete / failed.
    The items it closed, in wire order, are `output` (the final response's and the store's).
    """

    def __init__(self, summary: bool, hold_message: bool = False) -> None:
        self.summary = summary  # `reasoning.summary` set: reasoning_summary_* events instead
        self.seq = 0
        self.index = -1  # current_output_index
        self.output: list[dict[str, Any]] = []
        self._reasoning: tuple[str, int] | None = None  # (item id, output index) while open
        self._message: tuple[str, int] | None = None
        self._reasoning_text = ""
        self._message_text = ""
        # `responses_stream_generator_non_harmony`: with callable tools the message item's events
        # are held until a tool call or the terminal event decides its phase
        self._hold = hold_message
        self._held: list[bytes] = []

    def _event(self, payload: dict[str, Any], hold: bool = False) -> bytes:
        """`_send_event`: the event's number is its position in the stream."""
        if "sequence_number" in payload:
            payload["sequence_number"] = self.seq
        self.seq += 1
        kind: str = payload["type"]
        frame = b"event: " + kind.encode() + b"\ndata: " + _encode(payload) + b"\n\n"
        if hold or (self._held and self._hold):
            self._held.append(frame)
            return b""
        return frame

    def lifecycle(self, kind: str, response: dict[str, Any]) -> bytes:
        """`ResponsesLifecycleEvent` (type, response, sequence_number); a terminal one releases
        the held message events before it."""
        frame = self._event({"type": f"response.{kind}", "response": response, "sequence_number": -1})
        if kind in ("completed", "incomplete", "failed") and self._held:
            frame = b"".join(self._held)  # the terminal event itself was held last
            self._held.clear()
        return frame

    # ----------------------------------------------------------------------------- items

    def _open_reasoning(self) -> bytes:
        self.index += 1
        item_id = f"rs_{_uuid()}"
        self._reasoning = (item_id, self.index)
        self._reasoning_text = ""
        out = self._event(
            {
                "item": reasoning_item(item_id, None, "in_progress", False),
                "output_index": self.index,
                "sequence_number": -1,
                "type": "response.output_item.added",
            }
        )
        if self.summary:
            part = {"item_id": item_id, "output_index": self.index, "part": {"text": "", "type": "summary_text"}}
            return out + self._event(
                {**part, "sequence_number": -1, "summary_index": 0, "type": "response.reasoning_summary_part.added"}
            )
        return out + self._event(
            {
                "content_index": 0,
                "item_id": item_id,
                "output_index": self.index,
                "part": {"text": "", "type": "reasoning_text"},
                "sequence_number": -1,
                "type": "response.content_part.added",
            }
        )

    def _close_reasoning(self) -> bytes:
        if self._reasoning is None:
            return b""
        item_id, index = self._reasoning
        text = self._reasoning_text
        base = {"item_id": item_id, "output_index": index}
        if self.summary:
            out = self._event(
                {
                    **base,
                    "sequence_number": -1,
                    "summary_index": 0,
                    "text": text,
                    "type": "response.reasoning_summary_text.done",
                }
            )
            out += self._event(
                {
                    **base,
                    "part": {"text": text, "type": "summary_text"},
                    "sequence_number": -1,
                    "summary_index": 0,
                    "type": "response.reasoning_summary_part.done",
                }
            )
        else:
            out = self._event(
                {
                    "content_index": 0,
                    **base,
                    "sequence_number": -1,
                    "text": text,
                    "type": "response.reasoning_text.done",
                }
            )
            out += self._event(
                {
                    "content_index": 0,
                    **base,
                    "part": {"text": text, "type": "reasoning_text"},
                    "sequence_number": -1,
                    "type": "response.content_part.done",
                }
            )
        item = reasoning_item(item_id, text, "completed", self.summary)
        out += self._event(
            {"item": item, "output_index": index, "sequence_number": -1, "type": "response.output_item.done"}
        )
        self.output.append(item)
        self._reasoning = None
        return out

    def _open_message(self) -> bytes:
        self.index += 1
        item_id = f"msg_{_uuid()}"
        self._message = (item_id, self.index)
        self._message_text = ""
        added = {
            "item": message_item(item_id, None, "in_progress"),
            "output_index": self.index,
            "sequence_number": -1,
            "type": "response.output_item.added",
        }
        out = self._event(added, hold=self._hold)
        return out + self._event(
            {
                "content_index": 0,
                "item_id": item_id,
                "output_index": self.index,
                "part": _output_text(""),
                "sequence_number": -1,
                "type": "response.content_part.added",
            }
        )

    def _close_message(self) -> bytes:
        if self._message is None:
            return b""
        item_id, index = self._message
        text = self._message_text
        out = self._event(
            {
                "content_index": 0,
                "item_id": item_id,
                "logprobs": [],
                "output_index": index,
                "sequence_number": -1,
                "text": text,
                "type": "response.output_text.done",
            }
        )
        out += self._event(
            {
                "content_index": 0,
                "item_id": item_id,
                "output_index": index,
                "part": _output_text(text),
                "sequence_number": -1,
                "type": "response.content_part.done",
            }
        )
        item = message_item(item_id, text, "completed")
        out += self._event(
            {"item": item, "output_index": index, "sequence_number": -1, "type": "response.output_item.done"}
        )
        self.output.append(item)
        self._message = None
        return out

    # ------------------------------------------------------------------------------ steps

    def step(self, reasoning: str, text: str) -> bytes:
        """One engine step's reasoning-parser output: the reasoning delta first (closing an open
        message), then the normal text (closing the reasoning item, opening the message)."""
        out = b""
        if reasoning:
            out += self._close_message()
            if self._reasoning is None:
                out += self._open_reasoning()
            assert self._reasoning is not None
            item_id, index = self._reasoning
            self._reasoning_text += reasoning
            if self.summary:
                out += self._event(
                    {
                        "delta": reasoning,
                        "item_id": item_id,
                        "output_index": index,
                        "sequence_number": -1,
                        "summary_index": 0,
                        "type": "response.reasoning_summary_text.delta",
                    }
                )
            else:
                out += self._event(
                    {
                        "content_index": 0,
                        "delta": reasoning,
                        "item_id": item_id,
                        "output_index": index,
                        "sequence_number": -1,
                        "type": "response.reasoning_text.delta",
                    }
                )
        if text:
            out += self._close_reasoning()
            if self._message is None:
                out += self._open_message()
            assert self._message is not None
            item_id, index = self._message
            self._message_text += text
            out += self._event(
                {
                    "content_index": 0,
                    "delta": text,
                    "item_id": item_id,
                    "logprobs": [],
                    "output_index": index,
                    "sequence_number": -1,
                    "type": "response.output_text.delta",
                }
            )
        return out

    def close(self) -> bytes:
        """After the last step: the reasoning item, then the message item, closed."""
        return self._close_reasoning() + self._close_message()
