"""`--dataset agentic`: coding-agent loops of the Copilot-derived shape (`loadgen.agentic`) over HTTP.

A loop is a session: its calls go one after the other, the tool's run time (`AgentCall.delay_s`)
between an answer and the next call. Each call sends the whole context so far:

- a system prompt (`AgentLoop.system_tokens` of text, one of the shape's `apps`: shared by every
  loop of that app, so a server's prefix cache holds it);
- the first call's task and history (`added_tokens` of text);
- then, per call before it, the answer the server actually gave (its tool call, or its text) and
  the next call's new material (a tool result: a `tool` message answering that call, or a `user`
  message when the answer called no tool).

So a call's prompt starts with the previous call's prompt and answer, what the server cached when
it finished (less the reasoning, which a client does not send back). Every call offers the same
coding tools (chat templates render the tool schemas ahead of the conversation: a call without
them, or with `tool_choice: "none"`, which SGLang renders without them, would share no prefix with
the loop). A call the shape plans as a tool call asks for one (`tool_choice: "required"`) and ends
where the model ends it; a copy-heavy edit and the last answer leave the choice to the model
(`auto`) and ask for the planned length (x the thinking scale when thinking) with `ignore_eos`,
and the edit's new material ends with an instruction to rewrite the text above in full.
K2.6's settings come per loop (`loadgen.k26`).
Texts are the trace replay's word blocks (`loadgen.trace_text`), keyed by the loop.
"""

from __future__ import annotations

from typing import Any

import msgspec

from loadgen.agentic import AGENTIC_DOMAIN, AgentLoop, AgentShape, draw_loop
from loadgen.datasets import Message, Prompt
from loadgen.k26 import DEFAULT_THINKING_SCALE, DEFAULT_THINKING_SHARE, K26Mode, k26_mode, scaled_output
from loadgen.trace_file import BLOCK_TOKENS
from loadgen.trace_text import PromptText

__all__ = ["AGENT_TOOLS", "AgenticReplay", "TOOL_CALL_CAP"]

# A tool call ends where the model ends it; this caps a runaway one (a thinking call reasons first).
TOOL_CALL_CAP = 16384
COPY_INSTRUCTION = "\n\nRewrite the text above in full with the change applied, every other line as it is."


def _tool(name: str, description: str, **props: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
                "required": list(props),
            },
        },
    }


AGENT_TOOLS: list[dict[str, Any]] = [
    _tool("read_file", "Read a file of the repository.", path="path of the file"),
    _tool("search_code", "Search the repository for text or a symbol.", query="what to look for"),
    _tool("edit_file", "Replace a file's content.", path="path of the file", content="the new content"),
    _tool("run_tests", "Run the test suite, or one test file.", target="test file or directory"),
]


class AgenticReplay(msgspec.Struct, frozen=True, kw_only=True):
    shape: AgentShape = AgentShape()
    thinking_share: float = DEFAULT_THINKING_SHARE
    thinking_scale: float = DEFAULT_THINKING_SCALE
    seed: int = 0

    def loop(self, i: int) -> AgentLoop:
        return draw_loop(f"{self.seed}:{i}", self.shape)

    def mode(self, i: int) -> K26Mode:
        return k26_mode(self.thinking_share, self.seed, i)

    def _text(self, key: str, tokens: int) -> str:
        blocks = -(-tokens // BLOCK_TOKENS)
        return PromptText(str(self.seed)).join([f"{key}:{j}" for j in range(blocks)], tokens)

    def opening(self, loop: AgentLoop) -> tuple[Message, ...]:
        """The system prompt and the first call's task, as the loop's first messages."""
        system = self._text(f"agentic-system:{loop.app}", loop.system_tokens)
        return (Message("system", system), Message("user", self._added(loop, 0)))

    def _added(self, loop: AgentLoop, k: int) -> str:
        call = loop.calls[k]
        text = self._text(f"{loop.tag}:added:{k}", call.added_tokens)
        return text + COPY_INSTRUCTION if call.kind == "copy" else text

    def follow_up(self, loop: AgentLoop, k: int, tool_call_id: str | None) -> Message:
        """Call k's new material after the previous answer: a tool result when that answer called a
        tool, else a user message."""
        text = self._added(loop, k)
        if tool_call_id is not None:
            return Message("tool", text, tool_call_id=tool_call_id)
        return Message("user", text)

    def prompt(self, i: int, loop: AgentLoop, k: int, messages: tuple[Message, ...]) -> Prompt:
        """Call k of loop i (session i) with the context `messages`."""
        call = loop.calls[k]
        mode = self.mode(i)
        planned = scaled_output(call.output_tokens, mode.thinking, self.thinking_scale)
        tool = call.kind == "tool"
        return Prompt(
            messages=messages,
            domain=AGENTIC_DOMAIN,
            max_tokens=max(planned, TOOL_CALL_CAP) if tool else planned,
            tools=AGENT_TOOLS,
            tool_choice="required" if tool else "auto",
            ignore_eos=not tool,
            thinking=mode.thinking,
            temperature=mode.temperature,
            top_p=mode.top_p,
        )
