"""What a chat turn generates, token by token, and how SGLang's parsers turn it into chunks.

A turn's output (an `OutputScript`) is: when the model thinks, a reasoning segment whose last
token is `</think>` (Kimi-K2 emits it as text, so it survives `skip_special_tokens`); then either
the answer (words until max_tokens, as every twin generation) or one tool call in Kimi-K2 markup
followed by the end-of-turn token, after which the request stops.

`ChatChunker` replays what `serving_chat._generate_stream_content` does with each step's text:
- the kimi_k2 reasoning parser (`--reasoning-parser kimi_k2`, `separate_reasoning` true, the
  default) starts in reasoning mode unless `chat_template_kwargs.thinking` is false
  (`KimiK2Detector(reasoning_default="thinking")`), streams reasoning as `delta.reasoning_content`
  and, in the step where `</think>` arrives, both the reasoning before it and the text after it;
- with the parser off or `separate_reasoning: false`, the reasoning is content, `</think>`
  included, exactly as the model wrote it;
- the kimi_k2 tool-call parser (`--tool-call-parser kimi_k2`, tools given, tool_choice not
  "none") holds the call's header until `<|tool_call_argument_begin|>` arrives, then streams
  `delta.tool_calls` (id and name once, then argument text); content on that path is written by
  pydantic, not msgspec (chunks.py).
`reasoning_tokens` counts the reasoning segment including `</think>`, as SGLang's
`Req.update_reasoning_tokens` does, and only when the reasoning parser requires reasoning.
"""

from __future__ import annotations

from typing import Any

from twin import chunks
from twin.text import VOCAB, TokenStream
from twin.tools import ARG_BEGIN, PlannedCall, call_pieces

__all__ = ["THINK_END", "EOS_TOKEN_ID", "ChatChunker", "OutputScript"]

THINK_END = "</think>"
# Kimi-K2's end-of-turn token <|im_end|>; SGLang reports it as the stop's `matched` id.
# Assumption: the id from the K2 tokenizer (163586); the twin's own vocabulary has no such id.
EOS_TOKEN_ID = 163586


class OutputScript:
    """The tokens of one chat turn, handed out in order: (text, part) pairs with part one of
    reasoning | think_end | content | marker | id | args | eos."""

    __slots__ = ("reasoning_tokens", "call", "_words", "_tool", "_pos", "text_parts")

    def __init__(self, seed: int, reasoning_tokens: int, call: PlannedCall | None) -> None:
        self.reasoning_tokens = reasoning_tokens  # including </think>; 0 when not thinking
        self.call = call
        self._words = TokenStream(seed)
        self._tool = [*call_pieces(call), ("", "eos")] if call is not None else []
        self._pos = 0
        self.text_parts: list[str] = []  # everything generated so far, for the prefix cache

    @property
    def natural_length(self) -> int | None:
        """Tokens after which the model stops by itself (a tool call), else None."""
        return self.reasoning_tokens + len(self._tool) if self.call is not None else None

    def take(self, n: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        r = self.reasoning_tokens
        for _ in range(n):
            i = self._pos
            self._pos += 1
            if i < r - 1:
                out.append((VOCAB[self._words.take_ids(1)[0]], "reasoning"))
            elif i == r - 1:
                out.append((THINK_END, "think_end"))
            elif self._tool:
                j = i - r
                out.append(self._tool[j] if j < len(self._tool) else ("", "eos"))
            else:
                out.append((VOCAB[self._words.take_ids(1)[0]], "content"))
        self.text_parts.extend(t for t, _ in out)
        return out


class ChatChunker:
    """Turns each step's tokens into SGLang's chat chunks; also assembles the non-stream body."""

    def __init__(
        self,
        rid: str,
        created: int,
        model: str,
        *,
        reasoning_parser: bool,
        separate_reasoning: bool,
        thinking: bool,
        tool_parsing: bool,
        continuous_usage: bool,
        prompt_tokens: int,
        cached_tokens: int | None,
        call: PlannedCall | None = None,
        index: int = 0,
    ) -> None:
        self.rid = rid
        self.index = index  # the choice's, with `n` > 1
        self.created = created
        self.model = model
        self.split_reasoning = reasoning_parser and separate_reasoning
        self.counts_reasoning = reasoning_parser and thinking
        self.tool_parsing = tool_parsing
        self.continuous_usage = continuous_usage
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.completion_tokens = 0
        self.reasoning_tokens = 0
        self._in_reasoning = reasoning_parser and thinking
        self._header = False  # tool-call header complete (name sent)
        self._in_call = False
        self.has_tool_calls = False
        self.reasoning_text: list[str] = []
        self.content_text: list[str] = []
        self.call_args: list[str] = []
        self._call = call

    # ------------------------------------------------------------------ accounting

    def usage(self) -> dict[str, Any]:
        return chunks.usage_info(self.prompt_tokens, self.completion_tokens, self.reasoning_tokens, self.cached_tokens)

    def _chunk_usage(self) -> dict[str, Any] | None:
        return self.usage() if self.continuous_usage else None

    def _count(self, pieces: list[tuple[str, str]]) -> None:
        self.completion_tokens += len(pieces)
        if self.counts_reasoning:
            self.reasoning_tokens += sum(1 for _, p in pieces if p in ("reasoning", "think_end"))

    # ---------------------------------------------------------------------- stream

    def role_chunk(self) -> bytes:
        return chunks.chat_delta_chunk(
            self.rid, self.created, self.model, role="assistant", content="", index=self.index
        )

    def step(self, pieces: list[tuple[str, str]]) -> bytes:
        """The chunks of one engine step's tokens (possibly none)."""
        self._count(pieces)
        out: list[bytes] = []
        reasoning = ""
        rest: list[tuple[str, str]] = []
        for text, part in pieces:
            if self._in_reasoning and self.split_reasoning:
                if part == "think_end":
                    self._in_reasoning = False
                else:
                    reasoning += text
            else:
                if part == "think_end":
                    self._in_reasoning = False
                rest.append((text, part))
        if reasoning:
            self.reasoning_text.append(reasoning)
            out.append(
                chunks.chat_delta_chunk(
                    self.rid, self.created, self.model, reasoning=reasoning, usage=self._chunk_usage(), index=self.index
                )
            )
        if self.tool_parsing:
            out.extend(self._tool_stream(rest))
        else:
            text = "".join(t for t, _ in rest)
            if text:
                self.content_text.append(text)
                out.append(
                    chunks.chat_delta_chunk(
                        self.rid, self.created, self.model, content=text, usage=self._chunk_usage(), index=self.index
                    )
                )
        return b"".join(out)

    def _tool_stream(self, rest: list[tuple[str, str]]) -> list[bytes]:
        normal = ""
        args = ""
        first = False
        for text, part in rest:
            if part in ("marker", "id"):
                self._in_call = True
                if text == ARG_BEGIN:
                    self._header = True
                    first = True
            elif part == "args":
                args += text
            elif part != "eos":
                normal += text
        out: list[bytes] = []
        if normal:
            self.content_text.append(normal)
            out.append(
                chunks.chat_choice_chunk(
                    self.rid, self.created, self.model, content=normal, usage=self._chunk_usage(), index=self.index
                )
            )
        call = self._call
        if self._header and call is not None and (first or args):
            self.has_tool_calls = True
            self.call_args.append(args)
            delta = chunks.tool_call_delta(0, call.call_id if first else None, call.name if first else None, args)
            out.append(
                chunks.chat_choice_chunk(
                    self.rid, self.created, self.model, tool_calls=[delta], usage=self._chunk_usage(), index=self.index
                )
            )
        return out

    def finish_reason(self, engine_reason: str | None) -> tuple[str | None, int | None]:
        """The streamed finish chunk's reason and matched_stop."""
        if engine_reason == "stop":
            return ("tool_calls" if self.has_tool_calls else "stop"), EOS_TOKEN_ID
        return engine_reason, None

    def finish_chunk(self, engine_reason: str | None, rid: str | None = None) -> bytes:
        """`rid`: the chunk's id when not this sample's (SGLang writes `n` > 1 finish chunks under
        the last chunk's id)."""
        reason, matched = self.finish_reason(engine_reason)
        return chunks.chat_delta_chunk(
            rid or self.rid, self.created, self.model, finish_reason=reason, matched_stop=matched, index=self.index
        )

    # ------------------------------------------------------------------ non-stream

    def choice(self, engine_reason: str | None, meta_info: dict[str, Any] | None = None) -> dict[str, Any]:
        """The non-stream body's choice."""
        reasoning = "".join(self.reasoning_text) or None
        tool_calls = None
        reason, matched = engine_reason, None
        call = self._call
        if call is not None and self.has_tool_calls and engine_reason == "stop":
            tool_calls = [
                {
                    "id": call.call_id,
                    "index": 0,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ]
            reason = "tool_calls"
        elif engine_reason == "stop":
            matched = EOS_TOKEN_ID
        return chunks.chat_choice(
            self.index,
            content="".join(self.content_text),
            reasoning=reasoning,
            tool_calls=tool_calls,
            finish_reason=reason,
            matched_stop=matched,
            meta_info=meta_info,
        )

    def response(
        self, engine_reason: str | None, meta_info: dict[str, Any] | None, sglext: dict[str, Any] | None
    ) -> bytes:
        return chunks.response(
            self.rid,
            "chat.completion",
            self.created,
            self.model,
            [self.choice(engine_reason, meta_info)],
            self.usage(),
            sglext,
        )
