"""`--endpoint responses`: OpenAI's Responses API (`POST /v1/responses`) as loadgen sends and reads it.

The body carries the prompt's chat messages as Responses input items, which SGLang's
`serving_responses._construct_input_messages` turns back into the same chat messages (so the
prompt renders as the chat request's would): role/content message items (system messages stay
`role: "system"` items; text parts become `input_text` / `output_text`), an assistant's tool calls
as `function_call` items and tool results as `function_call_output` items. Tools are flattened
(`{"type": "function", "name", "description", "parameters"}`).

`max_output_tokens` is the run's max tokens + 2: SGLang's `ResponsesRequest.to_sampling_params`
keeps 2 tokens of headroom (`max_new_tokens = max_output_tokens - 2`), so this gives the same
output budget as a chat run with `max_tokens`. Not sent: `stream_options` (the usage arrives in
the terminal event), `return_spec_tokens_details` (SGLang's Responses API has no `sglext`: no
accept length), `ignore_eos` (`ResponsesRequest` has no such field). `store: false`: a load test
must not fill a server's response store; except with `--chain-responses`, where every session turn
is sent with `store: true` and each turn after the first with `previous_response_id` (the previous
turn's response id) and only its new user message as `input`: the server prepends the stored
conversation (`serving_responses._response_input_history`), so it needs `--enable-response-store`.

Reading: `ResponsesStreamParser` is the chat `StreamParser` (SSE framing, the stream clock, the
answer a session sends back) with the events translated by `common/responses_stream.py`; a
stream ends properly with its terminal event (`response.completed` / `incomplete` / `failed`).
The kept answer also carries the response's id (`response.created` / the terminal event's
`response.id`, or the non-streamed body's `id`): what the next chained turn names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.json_errors import JSON_DECODE_ERRORS
from common.responses_stream import ResponsesEvents, decode_event, decode_response, response_chunk
from loadgen.datasets import Message, Prompt
from loadgen.stream import StreamParser

if TYPE_CHECKING:
    from loadgen.client import Settings

__all__ = ["HEADROOM", "ResponsesStreamParser", "body", "input_items", "parse_full", "tool", "tool_choice"]

PATH = "/v1/responses"
HEADROOM = 2  # `ResponsesRequest.to_sampling_params`: max_new_tokens = max_output_tokens - 2


def _part(part: dict[str, Any], role: str) -> dict[str, Any]:
    """A chat content part as a Responses one (SGLang maps both back to the chat part)."""
    kind = part.get("type")
    if kind == "text":
        return {"type": "output_text" if role == "assistant" else "input_text", "text": part.get("text", "")}
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        out: dict[str, Any] = {"type": "input_image", "image_url": url}
        if isinstance(image, dict) and image.get("detail"):
            out["detail"] = image["detail"]
        return out
    return part


def _content(m: Message) -> str | list[dict[str, Any]]:
    if isinstance(m.content, list):
        return [_part(p, m.role) if isinstance(p, dict) else p for p in m.content]
    return m.content or ""


def input_items(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items (see the module docstring)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            output = m.content if isinstance(m.content, str) else m.text
            items.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": output})
            continue
        if m.content is not None or not m.tool_calls:
            items.append({"role": m.role, "content": _content(m)})
        for call in m.tool_calls or ():
            fn = call.get("function") or {}
            args = fn.get("arguments")
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": fn.get("name"),
                    "arguments": args if isinstance(args, str) else "{}",
                }
            )
    return items


def tool(chat_tool: dict[str, Any]) -> dict[str, Any]:
    """A chat tool (`{"type": "function", "function": {...}}`) as a flat Responses tool."""
    fn = chat_tool.get("function")
    if chat_tool.get("type") != "function" or not isinstance(fn, dict):
        return chat_tool
    out: dict[str, Any] = {"type": "function", "name": fn.get("name")}
    for key in ("description", "parameters", "strict"):
        if key in fn:
            out[key] = fn[key]
    return out


def tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """chat `{"type": "function", "function": {"name": N}}` -> `{"type": "function", "name": N}`."""
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def body(
    model: str,
    prompt: Prompt,
    s: Settings,
    *,
    stream: bool,
    store: bool = False,
    previous_response_id: str | None = None,
) -> dict[str, Any]:
    """The `/v1/responses` body of one request; a chained turn (`previous_response_id`) carries
    only its new messages in `prompt`, the server holds the rest."""
    out: dict[str, Any] = {
        "model": model,
        "input": input_items(prompt.messages),
        "max_output_tokens": s.max_tokens + HEADROOM,
        "temperature": s.temperature,
        "stream": stream,
        "store": store,
    }
    if previous_response_id is not None:
        out["previous_response_id"] = previous_response_id
    if s.top_p is not None:
        out["top_p"] = s.top_p
    if prompt.tools:
        out["tools"] = [tool(t) for t in prompt.tools]
        if prompt.tool_choice is not None:
            out["tool_choice"] = tool_choice(prompt.tool_choice)
    if s.thinking is not None:
        out["chat_template_kwargs"] = {"thinking": s.thinking}
    if s.priority is not None:  # SGLang's ResponsesRequest has the field, as chat does
        out["priority"] = s.priority
    return out


class ResponsesStreamParser(StreamParser):
    """`StreamParser` for a Responses stream: the same clock, answer and outcome; its events are
    typed (`event:` lines are skipped, the data's `type` says it all) and it ends with the
    terminal event instead of `data: [DONE]`."""

    __slots__ = ("_events",)

    END = "its terminal event (response.completed / incomplete / failed)"

    def __init__(self, t_send: float = 0.0, *, keep_answer: bool = False) -> None:
        super().__init__(t_send, keep_answer=keep_answer)
        self._events = ResponsesEvents()

    def _line(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        self.events += 1
        if payload == b"[DONE]":  # not SGLang's, but a proxy may add it
            return
        try:
            event = decode_event(payload)
        except JSON_DECODE_ERRORS as e:
            if self.bad is None:
                self.bad = f"undecodable event: {e}"
            return
        for chunk in self._events.chunks(event):
            self.observe(chunk, now)
        if self.answer is not None and self._events.response_id is not None:
            self.answer.response_id = self._events.response_id
        if self._events.terminal is not None:
            self.done = True


def parse_full(raw: bytes, parser: StreamParser, t_end: float) -> tuple[str, str] | None:
    """A non-streamed response into `parser` as one chunk arriving at the end; (error kind,
    detail) when it is not a usable response."""
    try:
        r = decode_response(raw)
    except JSON_DECODE_ERRORS as e:
        return "bad_response", f"undecodable response: {e}"
    if r.status is None:
        return "bad_response", "response has no status"
    parser.observe(response_chunk(r), t_end)
    if parser.answer is not None:
        parser.answer.response_id = r.id
    if r.status == "failed":
        return "stream_error", parser.error or "response failed"
    return None
