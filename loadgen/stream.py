"""Incremental parser of an OpenAI/SGLang server-sent-event stream, kept free of I/O.

The client feeds it bytes as they arrive, stamped with the arrival time; the parser keeps only
what the metrics need: when each content-bearing chunk arrived, how much text it carried, the
server's usage (final and, when the server sends continuous usage, per chunk), the `sglext`
speculation details, the finish reason, and a mid-stream error. Being pure, it is what the
crafted-stream tests drive directly.
"""

from __future__ import annotations

import msgspec


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None  # /v1/completions
    finish_reason: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class SpecDetails(msgspec.Struct):
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


class _Sglext(msgspec.Struct):
    spec_tokens_details: SpecDetails | list[SpecDetails] | None = None


class _ErrorBody(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    code: int | str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: Usage | None = None
    sglext: _Sglext | None = None
    error: _ErrorBody | str | None = None


_decoder = msgspec.json.Decoder(_Chunk)


class ContentChunk(msgspec.Struct, array_like=True):
    """A chunk that carried output text: arrival time (s), text length (chars), and the server's
    cumulative completion token count if it sent one with this chunk (continuous usage)."""

    time: float
    chars: int
    cum_tokens: int | None = None


def first_spec(details: SpecDetails | list[SpecDetails] | None) -> SpecDetails | None:
    """sglext carries a list when n > 1; loadgen sends n = 1, so take the first."""
    if isinstance(details, list):
        return details[0] if details else None
    return details


class StreamParser:
    """Feed with `feed(data, now)` for every read, then call `close(now)` at end of stream."""

    __slots__ = ("_buf", "chunks", "usage", "spec", "finish_reason", "error", "done", "events", "bad", "last_time")

    def __init__(self) -> None:
        self._buf = b""
        self.chunks: list[ContentChunk] = []
        self.usage: Usage | None = None
        self.spec: SpecDetails | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None  # message of a mid-stream `data: {"error": ...}`
        self.done = False  # saw `data: [DONE]`
        self.events = 0  # data events seen, [DONE] included
        self.bad: str | None = None  # first undecodable event, for the error detail
        self.last_time: float | None = None

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
            return "broken_stream", "stream ended before data: [DONE]"
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
        except msgspec.DecodeError as e:
            if self.bad is None:
                self.bad = f"undecodable event: {e}"
            return
        if chunk.error is not None:
            err = chunk.error
            self.error = err if isinstance(err, str) else (err.message or err.type or "error")
            return
        cum = chunk.usage.completion_tokens if chunk.usage is not None else None
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.sglext is not None and chunk.sglext.spec_tokens_details is not None:
            self.spec = first_spec(chunk.sglext.spec_tokens_details)
        if not chunk.choices:
            return
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
        delta = choice.delta
        if delta is not None:
            n = len(delta.content or "") + len(delta.reasoning_content or "")
        else:
            n = len(choice.text or "")
        if n:
            self.chunks.append(ContentChunk(now, n, cum))
