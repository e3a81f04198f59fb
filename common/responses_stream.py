"""The stream clock for OpenAI's Responses API (`POST /v1/responses`): the typed events of a
streamed response, and the response object of a non-streamed one, translated into the chat
chunks `common/stream_clock.py` already times, so both APIs share one definition of TTFT, first
reasoning / answer token, decode span and tokens. Pure: no I/O, no clock.

The wire (SGLang 0.5.23, `serving_responses.py`): frames `event: <type>\\ndata: <json>\\n\\n`,
no `data: [DONE]`. `response.created` and `response.in_progress` first, then per output item
`response.output_item.added`, `response.content_part.added`, deltas, `.done` events; the last
event is `response.completed`, `response.incomplete` (the budget ran out) or `response.failed`
(`response.error`), each carrying the whole response with its `usage`.

Translation (what counts as generated output, as in chat):

- `response.reasoning_text.delta`, `response.reasoning_summary_text.delta` -> reasoning
  (`delta.reasoning_content`).
- `response.output_text.delta` -> answer (`delta.content`).
- `response.output_item.added` of a `function_call` item (its name: chat's first tool-call
  delta) and `response.function_call_arguments.delta` / `response.custom_tool_call_input.delta`
  -> answer (`delta.tool_calls`, indexed by the call's order in the response).
- The terminal event -> a chunk with the finish reason and the usage (no output):
  completed -> "stop" ("tool_calls" when the output holds a call), incomplete -> "length"
  (`incomplete_details.reason` "max_output_tokens"; another reason is kept as is), failed ->
  "error" plus the error (`response.error`). Usage: `input_tokens` -> prompt_tokens,
  `output_tokens` -> completion_tokens, `input_tokens_details.cached_tokens`,
  `output_tokens_details.reasoning_tokens`.
- `{"type": "error", ...}` (OpenAI's error event) and `{"error": {...}}` (a gateway's) -> the error.
- Everything else (lifecycle, `.added` / `.done` of text parts) carries nothing.

There is no per-event usage (no `continuous_usage_stats`), so tokens per chunk are not exact.

API:

    events = ResponsesEvents()
    for payload in data_lines:                 # the bytes after `data:`
        for chunk in events.chunks(decode_event(payload)):
            clock.observe(chunk, now)
    events.terminal                            # "completed" | "incomplete" | "failed" | None
    events.response_id                         # the response's `id` (`response.created` / terminal)

    clock.observe(response_chunk(decode_response(body)), t_end)   # a non-streamed response
"""

from __future__ import annotations

from typing import Any

import msgspec

from common.stream_clock import ChatDelta, Choice, Chunk, FunctionDelta, StreamError, ToolCallDelta
from common.usage import CompletionTokensDetails, PromptTokensDetails, Usage

__all__ = [
    "ResponseObject",
    "ResponsesEvent",
    "ResponsesEvents",
    "ResponsesUsage",
    "decode_event",
    "decode_response",
    "finish_reason",
    "response_chunk",
    "responses_usage",
    "usage_of",
]

TERMINAL = frozenset({"completed", "incomplete", "failed"})
_CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
_ARGUMENT_DELTAS = frozenset({"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"})
_REASONING_DELTAS = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})


class _InputDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class ResponsesUsage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None


class _Part(msgspec.Struct):
    type: str | None = None
    text: str | None = None


class OutputItem(msgspec.Struct):
    """An output item: `reasoning` (content / summary), `message` (content), a tool call."""

    type: str | None = None
    id: str | None = None
    content: list[_Part] | None = None
    summary: list[_Part] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    input: str | None = None  # custom_tool_call


class _Incomplete(msgspec.Struct):
    reason: str | None = None


class ResponseObject(msgspec.Struct):
    """The response object (non-streamed body, or a lifecycle event's `response`)."""

    id: str | None = None
    status: str | None = None
    output: list[OutputItem] | None = None
    usage: ResponsesUsage | None = None
    error: StreamError | None = None
    incomplete_details: _Incomplete | None = None


class ResponsesEvent(msgspec.Struct):
    """One `data:` payload of a Responses stream, as far as the clock reads it."""

    type: str | None = None
    sequence_number: int | None = None
    delta: str | None = None
    item_id: str | None = None
    output_index: int | None = None
    item: OutputItem | None = None
    response: ResponseObject | None = None
    error: StreamError | str | None = None  # a gateway's `{"error": ...}`
    message: str | None = None  # `type: "error"` events
    code: int | str | None = None


_event_decoder = msgspec.json.Decoder(ResponsesEvent)
_response_decoder = msgspec.json.Decoder(ResponseObject)


def decode_event(payload: bytes) -> ResponsesEvent:
    """Decode the JSON after `data:`; raises msgspec.DecodeError."""
    return _event_decoder.decode(payload)


def decode_response(body: bytes) -> ResponseObject:
    """Decode a non-streamed response body; raises msgspec.DecodeError."""
    return _response_decoder.decode(body)


def responses_usage(obj: Any) -> Usage | None:
    """A Responses API `usage` as decoded JSON (`input_tokens`, `output_tokens` and their details:
    SGLang's `ResponsesResponse._serialize_usage`, `entrypoints/openai/protocol.py`) in the chat
    shape; None when absent or not of its shape (never raises)."""
    if obj is None:
        return None
    try:
        return usage_of(msgspec.convert(obj, ResponsesUsage))
    except msgspec.ValidationError:
        return None


def usage_of(u: ResponsesUsage | None) -> Usage | None:
    """The Responses usage under the chat names the clock reads."""
    if u is None:
        return None
    cached = u.input_tokens_details.cached_tokens if u.input_tokens_details is not None else None
    reasoning = u.output_tokens_details.reasoning_tokens if u.output_tokens_details is not None else None
    return Usage(
        prompt_tokens=u.input_tokens,
        completion_tokens=u.output_tokens,
        total_tokens=u.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached) if u.input_tokens_details else None,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning)
        if u.output_tokens_details
        else None,
    )


def finish_reason(r: ResponseObject) -> str | None:
    """The chat finish reason of a response's status (see the module docstring)."""
    if r.status == "completed":
        return "tool_calls" if any(i.type in _CALL_ITEMS for i in r.output or ()) else "stop"
    if r.status == "incomplete":
        reason = r.incomplete_details.reason if r.incomplete_details is not None else None
        return "length" if reason in (None, "max_output_tokens") else reason
    if r.status == "failed":
        return "error"
    return r.status


def _error(r: ResponseObject) -> StreamError:
    return r.error or StreamError(message=f"response {r.status}", type=r.status)


def _texts(parts: list[_Part] | None) -> str:
    return "".join(p.text or "" for p in parts or ())


def response_chunk(r: ResponseObject) -> Chunk:
    """A whole response as one chunk: its reasoning, answer text, tool calls, finish and usage
    (a failed response: its error)."""
    if r.status == "failed":
        return Chunk(error=_error(r), usage=usage_of(r.usage))
    content, reasoning = "", ""
    calls: list[ToolCallDelta] = []
    for item in r.output or ():
        if item.type == "message":
            content += _texts(item.content)
        elif item.type == "reasoning":
            reasoning += _texts(item.content) or _texts(item.summary)
        elif item.type in _CALL_ITEMS:
            args = item.arguments if item.type == "function_call" else item.input
            fn = FunctionDelta(name=item.name or "", arguments=args or "")
            calls.append(ToolCallDelta(index=len(calls), id=item.call_id, type="function", function=fn))
    delta = ChatDelta(content=content or None, reasoning_content=reasoning or None, tool_calls=calls or None)
    return Chunk(id=r.id, choices=[Choice(delta=delta, finish_reason=finish_reason(r))], usage=usage_of(r.usage))


def _delta_chunk(delta: ChatDelta) -> Chunk:
    return Chunk(choices=[Choice(delta=delta)])


class ResponsesEvents:
    """The state a stream's translation needs: which tool call an arguments delta belongs to,
    and the terminal status once it arrived."""

    __slots__ = ("_calls", "response_id", "terminal")

    def __init__(self) -> None:
        self._calls: dict[str | None, int] = {}  # item id -> tool-call index
        self.terminal: str | None = None  # completed | incomplete | failed
        self.response_id: str | None = None  # the `response.id` of a lifecycle event, once seen

    def chunks(self, ev: ResponsesEvent) -> tuple[Chunk, ...]:
        """The chat chunks one event stands for: none, one, or (usage, error) for a failure."""
        kind = ev.type
        if ev.response is not None and ev.response.id:
            self.response_id = ev.response.id
        if kind == "response.output_text.delta":
            return (_delta_chunk(ChatDelta(content=ev.delta)),) if ev.delta else ()
        if kind in _REASONING_DELTAS:
            return (_delta_chunk(ChatDelta(reasoning_content=ev.delta)),) if ev.delta else ()
        if kind in _ARGUMENT_DELTAS:
            if not ev.delta:
                return ()
            index = self._calls.get(ev.item_id, len(self._calls) - 1)
            call = ToolCallDelta(index=max(index, 0), function=FunctionDelta(arguments=ev.delta))
            return (_delta_chunk(ChatDelta(tool_calls=[call])),)
        if kind == "response.output_item.added":
            return self._call_added(ev.item)
        if kind is not None and kind.startswith("response.") and kind[9:] in TERMINAL:
            return self._terminal(kind[9:], ev.response)
        if kind == "error":
            return (Chunk(error=StreamError(message=ev.message, type="error", code=ev.code)),)
        if ev.error is not None:
            return (Chunk(error=ev.error),)
        return ()

    def _call_added(self, item: OutputItem | None) -> tuple[Chunk, ...]:
        if item is None or item.type not in _CALL_ITEMS:
            return ()
        index = self._calls.setdefault(item.id, len(self._calls))
        args = item.arguments if item.type == "function_call" else item.input
        fn = FunctionDelta(name=item.name or "", arguments=args or "")
        call = ToolCallDelta(index=index, id=item.call_id, type="function", function=fn)
        return (_delta_chunk(ChatDelta(tool_calls=[call])),)

    def _terminal(self, status: str, r: ResponseObject | None) -> tuple[Chunk, ...]:
        self.terminal = status
        r = r or ResponseObject(status=status)
        if r.status is None:
            r.status = status
        end = Chunk(choices=[Choice(finish_reason=finish_reason(r))], usage=usage_of(r.usage))
        if status == "failed":
            return end, Chunk(error=_error(r))
        return (end,)
