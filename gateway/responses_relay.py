"""SSE relay filter for the Responses API: forwards events untouched, reading what telemetry needs.

SGLang streams `/v1/responses` as typed events, `event: <type>` then `data: <json>`
(`entrypoints/openai/serving_responses.py`, `_send_event`). Generated output is a
`response.output_text.delta`, a `response.function_call_arguments.delta`, or (not the answer) a
`response.reasoning_text.delta` / `response.reasoning_summary_text.delta`: the stream clock of
docs/metrics.md, as for chat. The stream ends with a terminal event, `response.completed`,
`response.incomplete` or `response.failed`, which carries the response with its usage; only
those, `response.created` (the id) and errors are decoded. Nothing is removed: a Responses
stream's usage is the client's own.

A stream the gateway must cut (its backend broke, the gateway is shutting down) ends as SGLang ends
one that fails while streaming (`_responses_stream_generator_non_harmony`'s `except`): a
`response.failed` event whose response has status "failed" and an error with code "server_error",
numbered after the events sent (SGLang numbers them from 0, one each). No `[DONE]`: a Responses
stream has none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from common.responses_stream import responses_usage
from gateway.records import Result
from gateway.relay import ClockedRelay

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()

_ANSWER_DELTAS = (b"event: response.output_text.delta", b"event: response.function_call_arguments.delta")
_REASONING_DELTAS = (b"event: response.reasoning_text.delta", b"event: response.reasoning_summary_text.delta")
QUEUE_FULL = "The request queue is full."
_TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
# What a terminal status means as a chat finish reason (the records' and metrics' vocabulary).
_FINISH = {"completed": "stop", "incomplete": "length", "failed": "error", "cancelled": "abort"}


def read_response(result: Result, response: Any) -> None:
    """Fill `result` from a Responses API response object (a complete answer, or a terminal
    event's): usage, a chat-style finish reason, id, model, and the error of a failed one."""
    if not isinstance(response, dict):
        return
    result.usage = responses_usage(response.get("usage")) or result.usage
    status = response.get("status")
    if isinstance(status, str):
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        # a status that is no ending (queued, in_progress: a background answer, a stream cut short) has none
        result.finish_reason = _FINISH.get(status) if reason in (None, "max_output_tokens") else reason
    if isinstance(response.get("id"), str):
        result.response_id = response["id"]
    if isinstance(response.get("model"), str):
        result.response_model = response["model"]
    error = response.get("error")
    if status == "failed" and isinstance(error, dict):
        message = error.get("message")
        result.error = message if isinstance(message, str) else "upstream error"
        # Every failure is code "server_error" (`serving_responses.py: _error_from_finish_reason`);
        # a full queue, by its message (`scheduler.py: _abort_on_queued_limit`), is a 503: busy,
        # so a stream that failed so before its first token is tried on another backend.
        result.error_code = 503 if message == QUEUE_FULL else error.get("code")


class ResponsesRelay(ClockedRelay):
    """Feed it upstream bytes; it returns the bytes to send on (possibly empty) and fills
    `result` as the events go by. `result.done` once the terminal event has arrived."""

    __slots__ = ("_events", "_created")

    def __init__(self, clock: Callable[[], float] = time.perf_counter, result: Result | None = None) -> None:
        super().__init__(clock, result)
        self._events = 0  # sent on: the next event's sequence number
        self._created: dict[str, Any] | None = None  # the response as `response.created` announced it

    def feed(self, chunk: bytes) -> bytes:
        buf = self._buf + chunk if self._buf else chunk
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            self._event(buf[start : end + 2])
            self._events += 1
            start = end + 2
        self._buf = buf[start:]
        return buf[:start]

    def failure_event(self, message: str, type: str, code: object) -> bytes:
        """`response.failed` for the response being streamed: the one `response.created` announced
        (its id, creation time, model, tools, metadata...), failed, as SGLang makes its own from
        the request. `type` and `code` (the gateway's vocabulary) are not a Responses error's
        fields: its code is always "server_error"."""
        r = self.result
        response: dict[str, Any] = (
            dict(self._created)
            if self._created is not None
            else {
                "id": r.response_id,
                "object": "response",
                "created_at": int(time.time()),
                "model": r.response_model,
            }
        )
        response.update(status="failed", error={"code": "server_error", "message": message}, output=[], usage=None)
        event = {"type": "response.failed", "sequence_number": self._events, "response": response}
        return b"event: response.failed\ndata: " + _encoder.encode(event) + b"\n\n"

    def _event(self, event: bytes) -> None:
        if event.startswith(_ANSWER_DELTAS):
            self._generated(True)
        elif event.startswith(_REASONING_DELTAS):
            self._generated(False)
        elif event.startswith(b"event: response.output_text.") or event.startswith(b"event: response.content_part"):
            pass  # the text's done / part events: no new output, nothing to read
        else:
            self._decode(event)

    def _decode(self, event: bytes) -> None:
        data = event.find(b"data:")
        if data < 0:
            return
        payload = event[data + 5 :].strip()
        if payload == b"[DONE]":
            self.result.done = True
            return
        try:
            obj = _decoder.decode(payload)
        except JSON_DECODE_ERRORS:
            return
        if not isinstance(obj, dict):
            return
        r = self.result
        kind = obj.get("type")
        if kind in _TERMINAL:
            read_response(r, obj.get("response"))
            r.done = True
        elif kind == "response.created":
            created = obj.get("response")
            read_response(r, created)
            if isinstance(created, dict):
                self._created = created
        elif kind == "error" or ("error" in obj and kind is None):
            err = obj.get("error", obj)
            message = err.get("message") if isinstance(err, dict) else err
            r.error = message if isinstance(message, str) else "upstream error"
            r.error_code = err.get("code") if isinstance(err, dict) else None
