"""Incremental parser of an OpenAI/SGLang server-sent-event stream, kept free of I/O.

The client feeds it bytes as they arrive, stamped with the arrival time. Each `data:` event is
decoded once and handed to the shared stream clock (`common/stream_clock.py`: what counts as a
generated token, TTFT, first reasoning / answer token, per-chunk usage); the parser adds what only
loadgen needs: the `sglext` speculation details, SSE framing, the outcome of the stream and, for
multi-turn sessions, the answer text (so the next turn can send it back as history). Being
pure, it is what the crafted-stream tests drive directly.
"""

from __future__ import annotations

import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from common.stream_clock import Chunk, StreamClock, TokenMark
from common.usage import Usage

__all__ = ["AnswerText", "SpecDetails", "StreamParser", "TokenMark", "Usage", "first_spec"]


class SpecDetails(msgspec.Struct):
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


class _Sglext(msgspec.Struct):
    spec_tokens_details: SpecDetails | list[SpecDetails] | None = None


class _LoadgenChunk(Chunk):
    """The clock's chunk plus SGLang's response-level extension."""

    sglext: _Sglext | None = None


_decoder = msgspec.json.Decoder(_LoadgenChunk)


def first_spec(details: SpecDetails | list[SpecDetails] | None) -> SpecDetails | None:
    """sglext carries a list when n > 1; loadgen sends n = 1, so take the first."""
    if isinstance(details, list):
        return details[0] if details else None
    return details


class AnswerText(msgspec.Struct):
    """What the server answered, as the next turn of a session sends it back."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, object]] = msgspec.field(default_factory=list)
    response_id: str | None = None  # `--endpoint responses`: the response's id (what `previous_response_id` names)


class StreamParser:
    """Feed with `feed(data, now)` for every read, then call `close(now)` at end of stream.

    `clock.t_start` is the send time when the caller knows it (`StreamParser(t_send)`); the
    figures loadgen reports are relative to the send time it passes to `measure` anyway."""

    __slots__ = ("_buf", "answer", "bad", "clock", "done", "events", "last_time", "spec")

    END = "data: [DONE]"  # what a stream that ended properly ends with (`outcome`'s wording)

    def __init__(self, t_send: float = 0.0, *, keep_answer: bool = False) -> None:
        self._buf = b""
        self.clock = StreamClock(t_start=t_send, keep_marks=True)
        self.spec: SpecDetails | None = None
        self.done = False  # saw `data: [DONE]` (a subclass: its own end of stream)
        self.events = 0  # data events seen, [DONE] included
        self.bad: str | None = None  # first undecodable event, for the error detail
        self.last_time: float | None = None
        self.answer: AnswerText | None = AnswerText() if keep_answer else None

    # The clock's state under the names the metrics use.
    @property
    def chunks(self) -> list[TokenMark]:
        """One mark per chunk that carried generated output (reasoning, content, tool call, text)."""
        return self.clock.marks

    @property
    def usage(self) -> Usage | None:
        return self.clock.usage

    @usage.setter
    def usage(self, value: Usage | None) -> None:
        self.clock.usage = value

    @property
    def finish_reason(self) -> str | None:
        return self.clock.finish_reason

    @finish_reason.setter
    def finish_reason(self, value: str | None) -> None:
        self.clock.finish_reason = value

    @property
    def error(self) -> str | None:
        """Message of a mid-stream `data: {"error": ...}`."""
        err = self.clock.error
        if err is None:
            return None
        return err.message or err.type or "error"

    def feed(self, data: bytes, now: float) -> None:
        """Parse every complete line in `data` (plus what was buffered); all events that arrive in
        one read share its arrival time, which is when the client could first see them."""
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        self.last_time = now
        for line in lines:
            self._line(line, now)

    def close(self, now: float) -> None:
        """End of the byte stream: a last line without a newline still counts."""
        if self._buf.strip():
            self._line(self._buf, now)
        self._buf = b""

    def outcome(self) -> tuple[str | None, str | None]:
        """(error kind, detail) of a finished stream, (None, None) when it ended properly."""
        if self.error is not None:
            return "stream_error", self.error
        if self.bad is not None:
            return "bad_response", self.bad
        if self.events == 0:
            return "bad_response", "no server-sent events: not an OpenAI-compatible stream"
        if not self.done:
            return "broken_stream", f"stream ended before {self.END}"
        return None, None

    def _line(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:"):
            return  # blank separators, `: comments`, `event:` / `id:` fields
        payload = line[5:].strip()
        self.events += 1
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = _decoder.decode(payload)
        except JSON_DECODE_ERRORS as e:
            if self.bad is None:
                self.bad = f"undecodable event: {e}"
            return
        if chunk.sglext is not None and chunk.sglext.spec_tokens_details is not None:
            self.spec = first_spec(chunk.sglext.spec_tokens_details)
        self.observe(chunk, now)

    def observe(self, chunk: Chunk, now: float) -> None:
        """Account one decoded chunk (also how a non-streamed answer enters, as one chunk)."""
        out = self.clock.observe(chunk, now)
        if out and self.answer is not None:
            _keep_answer(self.answer, chunk)


def _keep_answer(answer: AnswerText, chunk: Chunk) -> None:
    """Append a chunk's output to the answer: deltas concatenate; tool-call deltas merge by index
    (the first delta of a call has its id and name, the later ones argument fragments)."""
    assert chunk.choices
    choice = chunk.choices[0]
    if choice.delta is None:
        answer.content += choice.text or ""
        return
    d = choice.delta
    answer.content += d.content or ""
    answer.reasoning += d.reasoning_content or ""
    for call in d.tool_calls or ():
        index = call.index if call.index is not None else len(answer.tool_calls)
        while len(answer.tool_calls) <= index:
            answer.tool_calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        slot = answer.tool_calls[index]
        fn = slot["function"]
        assert isinstance(fn, dict)
        if call.id:
            slot["id"] = call.id
        if call.function is not None:
            fn["name"] += call.function.name or ""
            fn["arguments"] += call.function.arguments or ""
