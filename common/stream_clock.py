"""The stream clock: one definition of what a streamed chat/completions response's timings and
token counts are, shared by the gateway's SSE relay and loadgen (the same bytes must give both
the same figures). Pure: no I/O, no clock of its own; callers pass the time each event arrived.

Definitions (docs/metrics.md has them for users):

- A chunk carries *generated output* when it has non-empty `delta.reasoning_content`
  (reasoning), non-empty `delta.content`, a non-empty `delta.tool_calls` list, or non-empty
  completions `text` (the last three are the *answer*). The role chunk (`content: ""`), the finish
  chunk, and the `choices: []` chunks (`sglext`, usage) carry none.
- TTFT = first chunk with generated output of any kind - start (the request's send time in a
  client, its receipt in a proxy). `ttft_reasoning` and `ttft_answer` are the same up to the
  first reasoning and the first answer chunk; on a thinking stream `ttft_answer - ttft` is the
  thinking time.
- Decode span = last - first chunk with generated output (any kind: a thinking stream decodes
  from its first reasoning token). Decode tok/s = (completion_tokens - 1) / decode span, when
  completion_tokens > 1 and the span is > 0.
- completion_tokens, reasoning_tokens and cached_tokens are the server's (`usage`, read as
  `common.usage` reads it): the last usage seen wins, which is the final usage chunk when the
  client asked for `include_usage`.
- Exact tokens per chunk: with `stream_options.continuous_usage_stats` every generated chunk
  carries the cumulative usage of the step that produced it; a chunk's tokens are the difference
  of `completion_tokens` from the previous generated chunk (the first: from 0). Tokens that made
  no text of their own (`</think>`, tool-call markers, a held-back partial UTF-8 character) count
  in the next chunk; tokens after the last chunk (a stop token) count in none. Two chunks of one
  step (reasoning that ends mid-step, then content) share its count: the first gets it, the
  second 0.

API:

    clock = StreamClock(t_start=t_send, keep_marks=True)
    for payload in data_lines:                  # the bytes after `data:`, `[DONE]` excluded
        clock.observe(decode_chunk(payload), now)  # or clock.observe_payload(payload, now)
    f = clock.figures()                         # ClockFigures: ttft, decode_tok_s, tokens, ...
    exact = chunk_token_counts(clock.marks)     # tokens per generated chunk, or None

`chunk_output(chunk)` classifies one decoded chunk: (`Output` bits, characters of output);
`StreamClock.observe` returns the same bits. `decode_chunk` raises
`msgspec.DecodeError` on bytes that are not a JSON object of this shape; unknown fields are
ignored, so servers that add fields (`sglext`, `logprobs`, `matched_stop`) decode the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from common.usage import Usage

__all__ = [
    "ChatDelta",
    "Choice",
    "Chunk",
    "ClockFigures",
    "FunctionDelta",
    "Output",
    "StreamClock",
    "StreamError",
    "TokenMark",
    "ToolCallDelta",
    "chunk_output",
    "chunk_token_counts",
    "decode_chunk",
]


class FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class ChatDelta(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class Choice(msgspec.Struct):
    index: int = 0
    delta: ChatDelta | None = None  # chat
    text: str | None = None  # /v1/completions
    finish_reason: str | None = None


class StreamError(msgspec.Struct):
    """A mid-stream `data: {"error": {...}}` (SGLang: an abort, or a full queue with code 503)."""

    message: str | None = None
    type: str | None = None
    code: int | str | None = None


class Chunk(msgspec.Struct):
    """One `data:` event of a chat or completions stream, as far as the clock reads it."""

    id: str | None = None
    model: str | None = None
    choices: list[Choice] | None = None
    usage: Usage | None = None
    error: StreamError | str | None = None


_decoder = msgspec.json.Decoder(Chunk)


def decode_chunk(payload: bytes) -> Chunk:
    """Decode the JSON after `data:` (not `[DONE]`); raises msgspec.DecodeError."""
    return _decoder.decode(payload)


class Output:
    """What generated output one chunk carried: bits of an int (plain ints rather than an
    enum.IntFlag, whose Python-level operators would run for every chunk on a client's hot path)."""

    NONE = 0
    REASONING = 1  # non-empty delta.reasoning_content
    ANSWER = 2  # non-empty delta.content, delta.tool_calls, or completions text


_REASONING, _ANSWER = Output.REASONING, Output.ANSWER


def _tool_chars(calls: list[ToolCallDelta]) -> int:
    n = 0
    for c in calls:
        if c.function is not None:
            n += len(c.function.name or "") + len(c.function.arguments or "")
    return n


def chunk_output(chunk: Chunk) -> tuple[int, int]:
    """The kinds of generated output in a chunk (first choice; loadgen and the gateway send n = 1)
    and its length in characters (reasoning + content + tool-call name and arguments + text)."""
    if not chunk.choices:
        return 0, 0
    choice = chunk.choices[0]
    delta = choice.delta
    if delta is None:
        text = choice.text
        return (_ANSWER, len(text)) if text else (0, 0)
    out = 0
    chars = 0
    if delta.reasoning_content:
        out |= _REASONING
        chars += len(delta.reasoning_content)
    if delta.content:
        out |= _ANSWER
        chars += len(delta.content)
    if delta.tool_calls:
        out |= _ANSWER
        chars += _tool_chars(delta.tool_calls)
    return out, chars


class TokenMark(msgspec.Struct, array_like=True):
    """A chunk with generated output: arrival time (s), text length (chars), and the cumulative
    completion tokens of its usage when the server sent per-chunk usage."""

    time: float
    chars: int
    cum_tokens: int | None = None


class ClockFigures(msgspec.Struct, kw_only=True):
    """The clock's figures for one stream; seconds, None where a figure does not exist."""

    ttft: float | None = None  # start -> first generated output of any kind
    ttft_reasoning: float | None = None  # start -> first reasoning
    ttft_answer: float | None = None  # start -> first answer (content, tool call, text)
    decode_span: float | None = None  # first -> last generated output
    decode_tok_s: float | None = None  # (completion_tokens - 1) / decode_span
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None


class StreamClock(msgspec.Struct, kw_only=True):
    """Accumulates one stream. `observe` every decoded chunk in arrival order, then `figures()`.

    `keep_marks` keeps a `TokenMark` per generated chunk (what per-token ITL needs; a proxy that
    only needs TTFT and decode speed leaves it off and keeps nothing per chunk)."""

    t_start: float
    keep_marks: bool = False
    t_first: float | None = None
    t_first_reasoning: float | None = None
    t_first_answer: float | None = None
    t_last: float | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    error: StreamError | None = None
    generated_chunks: int = 0
    marks: list[TokenMark] = msgspec.field(default_factory=list)

    def observe(self, chunk: Chunk, now: float) -> int:
        """Account one decoded chunk that arrived at `now`; returns what output it carried."""
        if chunk.error is not None:
            err = chunk.error
            self.error = StreamError(message=err) if isinstance(err, str) else err
            return 0
        if chunk.usage is not None:
            self.usage = chunk.usage
        out, chars = chunk_output(chunk)
        if chunk.choices and chunk.choices[0].finish_reason is not None:
            self.finish_reason = chunk.choices[0].finish_reason
        if not out:
            return out
        if self.t_first is None:
            self.t_first = now
        if out & _REASONING and self.t_first_reasoning is None:
            self.t_first_reasoning = now
        if out & _ANSWER and self.t_first_answer is None:
            self.t_first_answer = now
        self.t_last = now
        self.generated_chunks += 1
        if self.keep_marks:
            cum = chunk.usage.completion_tokens if chunk.usage is not None else None
            self.marks.append(TokenMark(now, chars, cum))
        return out

    def observe_payload(self, payload: bytes, now: float) -> int:
        """`observe(decode_chunk(payload), now)`; raises msgspec.DecodeError."""
        return self.observe(_decoder.decode(payload), now)

    def figures(self, completion_tokens: int | None = None) -> ClockFigures:
        """The figures of the stream so far. `completion_tokens` overrides the usage count (a
        client without usage passes its own count)."""
        u = self.usage
        n = completion_tokens if completion_tokens is not None else (u.completion_tokens if u else None)
        f = ClockFigures(
            completion_tokens=n,
            reasoning_tokens=u.reasoning_tokens if u else None,
            cached_tokens=u.cached_tokens if u else None,
            prompt_tokens=u.prompt_tokens if u else None,
        )
        if self.t_first is None or self.t_last is None:
            return f
        f.ttft = self.t_first - self.t_start
        if self.t_first_reasoning is not None:
            f.ttft_reasoning = self.t_first_reasoning - self.t_start
        if self.t_first_answer is not None:
            f.ttft_answer = self.t_first_answer - self.t_start
        span = self.t_last - self.t_first
        f.decode_span = span
        if n is not None and n > 1 and span > 0:
            f.decode_tok_s = (n - 1) / span
        return f


def chunk_token_counts(marks: Sequence[TokenMark]) -> list[int] | None:
    """Exact tokens per generated chunk from the cumulative per-chunk usage (see the module
    docstring); None when any chunk lacks it (the server did not send continuous usage)."""
    out: list[int] = []
    prev = 0
    for m in marks:
        if m.cum_tokens is None:
            return None
        out.append(max(0, m.cum_tokens - prev))
        prev = max(prev, m.cum_tokens)
    return out
