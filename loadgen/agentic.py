"""The agentic traffic shape: coding-agent loops as GitHub Copilot's agent runs them.

One *loop* is a user's request to an agent: a sequence of model calls, each sending the whole
context so far (a shared system prompt with the tool schemas, the task and the session's earlier
turns, then every call's output and every tool result), where every call but the last ends in a
tool call and the tool runs before the next call. Long, mostly cached prompts and short outputs.

Public figures (GitHub Copilot coding-agent traces, June 2026, `Azure/AzurePublicDataset`,
`GitHubCopilotCodingAgentDataset2026.md` and its dataset card; CC-BY 4.0): 9,310,255 model calls
in 1,189,581 user turns (7.83 calls a turn); 631.4B prompt tokens, 540.95B of them cached, 4.91B
completion tokens. So a call sends 67.8K prompt tokens on average, 85.7% of them cached, and
writes 527 tokens; 83% of calls end in a tool batch (7,767,261 batches). The defaults below are
chosen so that the shape reproduces those means by this arithmetic:

- calls per loop uniform in `calls` (2..14): mean 8 (7.83);
- the first call: system prompt `system_tokens` (12-16K; tool schemas and instructions, one of
  `apps` shared by many sessions) + `context_tokens` (5-60K: the task and the session's earlier
  turns; a Copilot session has 3.95 turns) = 46.5K on average;
- each later call adds the previous call's output and a tool result of `tool_result_tokens`
  (0.5-9K, mean 4.75K): 5.25K per call;
- mean prompt per call = 46.5K + 5.25K x E[k] over calls, E[k] = E[n(n-1)/2] / E[n] = 35 / 8 =
  4.375: 69.5K (67.8K);
- prefix that a server which kept the loop could reuse: 1 - (32.5K + 7 x 4.75K) / (8 x 46.5K +
  5.25K x 35) = 88% (85.7% measured: caches also miss);
- outputs: a tool call `tool_call_tokens` (40-400, mean 220), the last call's answer
  `answer_tokens` (300-1,500, mean 900), and a copy-heavy edit `copy_tokens` (0.8-2.4K, mean
  1.6K: the model re-emits a file, or a region of one, that the task or a tool result put in the
  context, as edit tools whose arguments hold the new text do) on `copy_share` (17%) of the calls
  that end in a tool call: 8 calls hold 1 answer, 1.2 edits and 5.8 tool calls, (900 + 1.2 x
  1,600 + 5.8 x 220) / 8 = 512 tokens a call (527); 15% of calls are copy-heavy.

Assumptions, with the measurement that would replace them: the shapes (uniform ranges) and the
split between first context and growth (the release's per-call `message_metadata` token counts
give both); the copy-heavy share (the release's tool names give the share of edit calls); the
tool latency `tool_s` (its `tool_batches[].duration_ms`). A thinking K2.6 call writes its
reasoning before these outputs (`loadgen.k26`).

`draw_loop(tag, shape)` draws a loop's structure from its own seeded stream: the same tag, the
same loop, for loadgen (which renders it as text) and the evaluator (as token counts and prefix
chains) alike.
"""

from __future__ import annotations

import random

import msgspec

__all__ = ["AGENTIC_DOMAIN", "AgentCall", "AgentLoop", "AgentShape", "draw_loop"]

AGENTIC_DOMAIN = "code"  # a coding agent


class AgentShape(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The loop's distributions; defaults from the Copilot figures (module docstring)."""

    calls: tuple[int, int] = (2, 14)
    apps: int = 4
    system_tokens: tuple[int, int] = (12_000, 16_000)
    context_tokens: tuple[int, int] = (5_000, 60_000)
    tool_result_tokens: tuple[int, int] = (500, 9_000)
    tool_call_tokens: tuple[int, int] = (40, 400)
    answer_tokens: tuple[int, int] = (300, 1_500)
    copy_share: float = 0.17
    copy_tokens: tuple[int, int] = (800, 2_400)
    tool_s: float = 1.5  # mean tool run time between calls (exponential)

    def validate(self) -> None:
        for name in (
            "calls",
            "system_tokens",
            "context_tokens",
            "tool_result_tokens",
            "tool_call_tokens",
            "answer_tokens",
            "copy_tokens",
        ):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"agentic.{name}: need 1 <= low <= high, got ({lo}, {hi})")
        if not 0.0 <= self.copy_share <= 1.0 or self.apps < 1 or self.tool_s < 0:
            raise ValueError("agentic: copy_share in [0, 1], apps >= 1, tool_s >= 0")

    @property
    def mean_calls(self) -> float:
        return sum(self.calls) / 2


class AgentCall(msgspec.Struct, frozen=True, kw_only=True):
    """One model call of a loop. `added_tokens`: what it adds to the previous call's prompt and
    output (the first call: the task and history after the system prompt; later: a tool result)."""

    kind: str  # tool | copy | answer
    added_tokens: int
    output_tokens: int
    copy_from: int | None = None  # copy: the call whose added text (task or tool result) it re-emits
    delay_s: float = 0.0  # tool time before this call is sent (0 for the first)


class AgentLoop(msgspec.Struct, frozen=True, kw_only=True):
    tag: str
    app: int  # which shared system prompt
    system_tokens: int
    calls: tuple[AgentCall, ...]


def _uniform(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def draw_loop(tag: str, shape: AgentShape) -> AgentLoop:
    """Everything loop `tag` sends, drawn from its own seeded stream."""
    rng = random.Random(f"agentic:{tag}")
    app = rng.randrange(shape.apps)
    system = _uniform(random.Random(f"agentic-system:{app}"), shape.system_tokens)
    n = _uniform(rng, shape.calls)
    calls: list[AgentCall] = []
    for k in range(n):
        added = _uniform(rng, shape.context_tokens) if k == 0 else _uniform(rng, shape.tool_result_tokens)
        delay = rng.expovariate(1 / shape.tool_s) if k and shape.tool_s > 0 else 0.0
        if k == n - 1:
            call = AgentCall(kind="answer", added_tokens=added, output_tokens=_uniform(rng, shape.answer_tokens))
        elif rng.random() < shape.copy_share:
            out = min(_uniform(rng, shape.copy_tokens), added)  # no more than the text it copies
            call = AgentCall(kind="copy", added_tokens=added, output_tokens=out, copy_from=rng.randrange(k + 1))
        else:
            call = AgentCall(kind="tool", added_tokens=added, output_tokens=_uniform(rng, shape.tool_call_tokens))
        calls.append(msgspec.structs.replace(call, delay_s=delay))
    return AgentLoop(tag=tag, app=app, system_tokens=system, calls=tuple(calls))
