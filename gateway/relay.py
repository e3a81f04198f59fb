"""SSE relay filter: forwards upstream events as they arrive, reading only what telemetry needs.

The stream clock is `common.stream_clock`'s definition (docs/metrics.md): a chunk carries generated
output when it has non-empty `delta.reasoning_content`, `delta.content`, a `delta.tool_calls` entry,
or completions `text`; TTFT runs to the first such chunk of any kind, decode speed over first to
last. tests/unit/test_relay.py checks that this relay and that definition agree on SGLang-shaped bytes.

Chunks in flight (`"finish_reason":null`, not `choices: []`) are recognised by byte searches and
forwarded untouched: no JSON decode on the hot path. The searches are exact for compact JSON: inside
a JSON string every quote is escaped, so `"content":"` can only be a key and its value's opening
quote, and the next byte says whether the value is empty. Every other event (finish chunk, SGLang's
`choices: []` chunks with `sglext` or `usage`, errors, JSON with spaces) is decoded. Telemetry the
gateway requested for itself (spec details, usage) is removed unless the client asked for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from common.usage import usage
from gateway.errors import sse_error_event
from gateway.records import Result

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()

_IN_FLIGHT = b'"finish_reason":null'
_EMPTY_CHOICES = b'"choices":[]'
_QUOTE = 0x22
# A key and its string value's opening quote: the value is non-empty when the next byte is not `"`.
_CONTENT, _TEXT, _REASONING = b'"content":"', b'"text":"', b'"reasoning_content":"'
_CONTENT_LEN, _TEXT_LEN, _REASONING_LEN = len(_CONTENT), len(_TEXT), len(_REASONING)
_TOOL_CALL = b'"tool_calls":[{'


class StreamRelay(Protocol):
    """What the proxy needs of a stream's relay: this module's for chat and completions,
    gateway.responses_relay's for the Responses API."""

    result: Result

    def feed(self, chunk: bytes) -> bytes: ...

    def leftover(self) -> bytes: ...

    def failure_event(self, message: str, type: str, code: object) -> bytes:
        """The stream's last event when the gateway must end it after its first byte."""
        ...


class ClockedRelay:
    """What every relay shares: the result it fills, the bytes of an unfinished event, and the
    stream clock (docs/metrics.md) that a generated token moves."""

    __slots__ = ("result", "_buf", "_clock")

    def __init__(self, clock: Callable[[], float] = time.perf_counter, result: Result | None = None) -> None:
        self.result = result if result is not None else Result()
        self._buf = b""
        self._clock = clock

    def leftover(self) -> bytes:
        """Bytes of an unterminated last event (a broken upstream stream)."""
        return self._buf

    def _generated(self, answer: bool) -> None:
        now = self._clock()
        r = self.result
        if r.t_first is None:
            r.t_first = now
        if answer and r.t_first_answer is None:
            r.t_first_answer = now
        r.t_last = now
        r.generated += 1


class SseRelay(ClockedRelay):
    """Feed it upstream bytes; it returns the bytes to send to the client (possibly empty) and
    fills `result` as the events go by."""

    __slots__ = ("keep_usage", "keep_spec")

    def __init__(
        self,
        keep_usage: bool,
        keep_spec: bool,
        clock: Callable[[], float] = time.perf_counter,
        result: Result | None = None,
    ) -> None:
        super().__init__(clock, result)
        self.keep_usage = keep_usage
        self.keep_spec = keep_spec

    def failure_event(self, message: str, type: str, code: object) -> bytes:
        return sse_error_event(message, type, code)

    def feed(self, chunk: bytes) -> bytes:
        # Exactly one whole event, the usual read: it ends with the blank line and has no other
        # newline (a one-byte find is a memchr, cheaper than searching for b"\n\n"; an event with a
        # newline elsewhere, e.g. multi-line data, takes the general loop, same result).
        if not self._buf and chunk.endswith(b"\n\n") and chunk.find(b"\n", 0, -2) < 0:
            return self._event(chunk) or b""
        buf = self._buf + chunk if self._buf else chunk
        start = 0
        out: list[bytes] = []
        while (end := buf.find(b"\n\n", start)) >= 0:
            event = buf[start : end + 2]
            start = end + 2
            forwarded = self._event(event)
            if forwarded:
                out.append(forwarded)
        self._buf = buf[start:]
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        # rfind: finish_reason sits near the end of a chunk, so the search stops early (`in` scans
        # from the start); the test is the same, presence.
        if event.rfind(_IN_FLIGHT) >= 0 and _EMPTY_CHOICES not in event:
            i = event.find(_CONTENT)
            if i >= 0 and event[i + _CONTENT_LEN] != _QUOTE:  # the usual chunk: content, first search
                self._generated(True)
            elif (i := event.find(_REASONING)) >= 0 and event[i + _REASONING_LEN] != _QUOTE:
                self._generated(False)
            elif ((i := event.find(_TEXT)) >= 0 and event[i + _TEXT_LEN] != _QUOTE) or _TOOL_CALL in event:
                self._generated(True)
            return event
        return self._slow(event)

    def _slow(self, event: bytes) -> bytes | None:
        payload = event.strip()
        if not payload.startswith(b"data:"):
            return event  # comments / other SSE fields pass through
        payload = payload[5:].strip()
        if payload == b"[DONE]":
            self.result.done = True
            return event
        try:
            obj = _decoder.decode(payload)
        except JSON_DECODE_ERRORS:
            return event
        if not isinstance(obj, dict):
            return event
        r = self.result
        if "error" in obj:
            err = obj["error"]
            if isinstance(err, dict):
                message = err.get("message")
                r.error = message if isinstance(message, str) else "upstream error"
                r.error_code = err.get("code")
            else:
                r.error = str(err)
            return event
        choices = obj.get("choices")
        if choices:
            if obj.get("usage") is not None:  # continuous usage stats: the latest wins
                r.usage = usage(obj["usage"]) or r.usage
            for c in choices:
                if isinstance(c, dict):
                    self._choice(c, obj)
            return event
        changed = False
        if "sglext" in obj:
            r.sglext = obj["sglext"]
            if not self.keep_spec:
                del obj["sglext"]
                changed = True
        if obj.get("usage") is not None:
            r.usage = usage(obj["usage"]) or r.usage
            if not self.keep_usage:
                obj["usage"] = None
                changed = True
        if not changed:
            return event
        if obj.get("usage") is None and "sglext" not in obj:
            return None  # a telemetry-only chunk the client did not ask for
        return b"data: " + _encoder.encode(obj) + b"\n\n"

    def _choice(self, c: dict[str, Any], obj: dict[str, Any]) -> None:
        r = self.result
        if c.get("finish_reason"):
            r.finish_reason = c["finish_reason"]
            r.response_id = obj.get("id") if isinstance(obj.get("id"), str) else None
            r.response_model = obj.get("model") if isinstance(obj.get("model"), str) else None
        delta = c.get("delta")
        if isinstance(delta, dict):
            if _text(delta.get("content")) or (isinstance(delta.get("tool_calls"), list) and delta["tool_calls"]):
                self._generated(True)
            elif _text(delta.get("reasoning_content")):
                self._generated(False)
        elif _text(c.get("text")):
            self._generated(True)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
