"""What the evaluation's clients send: sessions of turns, drawn before any routing happens.

A *session* is the unit of arrival (open loop) or of a client's work (closed loop). It is one
of three kinds, drawn per session from the phase's `Mix`:

- `single`: one request (the closed-loop scenarios are all single requests);
- `chat`: a multi-turn conversation. Each turn re-sends the whole history (system prompt, earlier
  user messages and the answers the model gave) plus a new user message, after a think time.
  SGLang's radix cache makes such a turn cheap only on the server that holds its prefix;
- `agent`: a tool-using loop. The request offers tools; each call but the last ends in a tool
  call (a short output, `finish_reason: "tool_calls"`), the tool's result is appended and the
  loop continues after the tool's latency; the last call answers.

Axes per session: the domain, thinking on/off (a reasoning segment before the answer,
its length from the twin's `twin.thinking.reasoning_tokens` for the model, so the
virtual clock and the HTTP twin agree on it), a temperature drawn from the mix, a long-context
share (the first message carries a document of tens of thousands of tokens) and a shared system
prompt (one of `system_prompts` per kind: many sessions of one application start alike).

Prefixes. Every prompt carries the hash chain of its blocks (`twin.prefix_cache`, one
element per 64 tokens), which is what both the twin's prefix cache and the gateway's prefix
tracker (`RequestFeatures.prefix`) key on. A turn's chain extends the chain of the previous
turn's prompt + output, so a server that served the previous turn holds all of it, except with
thinking: the chat template drops earlier turns' reasoning from the history it renders, so the
next turn shares only the previous *prompt* with what the server cached (assumption: the
Kimi K2 thinking template renders past assistant turns without their reasoning; inside one
tool-calling loop the reasoning stays, so agent calls keep the whole prefix).

Everything a session contains depends only on its tag (run seed, scenario, phase, stream index),
never on routing: every contestant faces the same requests (common random numbers). Only when a
turn is sent depends on how fast the previous one finished.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from twin.domain import prompt_key
from twin.prefix_cache import chain_from_tokens
from twin.thinking import ReasoningModel, reasoning_tokens

__all__ = ["KINDS", "Mix", "Session", "Turn", "draw_session", "single_request"]

KINDS = ("single", "chat", "agent")
TOOL_CALL_TOKENS = (24, 120)  # a JSON function call (assumption: name + a few arguments)


class Mix(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The realism axes of a phase's traffic (shares are of sessions)."""

    chat: float = 0.0  # multi-turn conversations
    agent: float = 0.0  # tool-calling loops (the tool share: every call of an agent offers tools)
    thinking: float = 0.0  # sessions with thinking on
    temperatures: tuple[tuple[float, float], ...] = ((0.0, 1.0),)  # (temperature, weight)
    long_context: float = 0.0  # sessions whose first message carries a long document
    long_tokens: tuple[int, int] = (16384, 65536)
    prompt_tokens: tuple[int, int] = (50, 400)  # a user message (a single request's prompt)
    turns: tuple[int, int] = (2, 6)  # chat turns per conversation
    think_s: float = 15.0  # mean user think time between chat turns (exponential)
    tool_calls: tuple[int, int] = (2, 6)  # calls per agent loop, the answering one included
    tool_result_tokens: tuple[int, int] = (200, 2000)
    tool_s: float = 1.5  # mean tool latency between agent calls (exponential)
    system_prompts: int = 4  # distinct shared system prompts per session kind
    system_tokens: tuple[int, int] = (200, 1200)  # chat system prompt
    agent_system_tokens: tuple[int, int] = (2000, 6000)  # agent system prompt with tool schemas
    # Chat follow-ups that ask for the previous answer back with edits ("rename x and return the
    # full file"): the answer repeats the previous one's length, and its text (`Turn.copy_of`).
    rewrite: float = 0.0

    def validate(self) -> None:
        for name in ("chat", "agent", "thinking", "long_context", "rewrite"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"mix.{name} is a share in [0, 1], got {v!r}")
        if self.chat + self.agent > 1.0 + 1e-9:
            raise ValueError(f"mix.chat + mix.agent is at most 1, got {self.chat + self.agent:g}")
        if (
            not self.temperatures
            or any(w < 0 or not 0.0 <= t <= 2.0 for t, w in self.temperatures)
            or sum(w for _, w in self.temperatures) <= 0
        ):
            raise ValueError("mix.temperatures: (temperature in [0, 2], weight >= 0) pairs with a positive total")
        for name in (
            "long_tokens",
            "prompt_tokens",
            "turns",
            "tool_calls",
            "tool_result_tokens",
            "system_tokens",
            "agent_system_tokens",
        ):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"mix.{name}: need 1 <= low <= high, got ({lo}, {hi})")
        if self.think_s < 0 or self.tool_s < 0 or self.system_prompts < 1:
            raise ValueError("mix.think_s and mix.tool_s must be >= 0, mix.system_prompts >= 1")

    @property
    def mean_turns(self) -> float:
        """Requests per session, on average (open-loop rates are per request, arrivals per session)."""
        single = 1.0 - self.chat - self.agent
        return single + self.chat * sum(self.turns) / 2 + self.agent * sum(self.tool_calls) / 2


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a session, as the client sends it."""

    tag: str  # seeds the engine's per-request draws (the prompt text's stand-in)
    domain: str
    prompt_tokens: int
    answer_tokens: int  # content (or tool call) tokens after any reasoning
    reasoning_tokens: int
    temperature: float
    thinking: bool
    tools: bool
    tool_call: bool  # the answer is a tool call
    chain: tuple[int, ...]  # the prompt's block chain
    output_chain: tuple[int, ...]  # prompt + output: what the server caches when it finishes
    delay_s: float = 0.0  # think / tool time before this turn is sent (0 for the first)
    top_p: float = 1.0
    copy: bool = False  # the output re-emits text of the prompt (an edit that rewrites a file it read)
    # The output returns the answer of this session's turn `copy_of` (its tag), `copy_tokens` long,
    # changed: text a server generated, which an NGRAM server that generated it drafts from its trie.
    copy_of: str = ""
    copy_tokens: int = 0

    @property
    def max_tokens(self) -> int:
        return self.reasoning_tokens + self.answer_tokens


class Session(msgspec.Struct, frozen=True, kw_only=True):
    tag: str
    kind: str  # single | chat | agent (drawn from a mix), trace (a trace's row; evaluate.sources)
    domain: str
    turns: tuple[Turn, ...]
    exact_length: bool = False  # the client's max_tokens is the output length (ignore_eos runs)


def _uniform(rng: random.Random, bounds: Sequence[int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def single_request(tag: str, domain: str, prompt_tokens: int, max_tokens: int) -> Session:
    """The closed-loop scenarios' request: no thinking, greedy, a fresh prompt."""
    chain = tuple(chain_from_tokens(prompt_tokens, tag))
    out = tuple(chain_from_tokens(prompt_tokens + max_tokens, tag + ":out", chain))
    return Session(
        tag=tag,
        kind="single",
        domain=domain,
        exact_length=True,
        turns=(
            Turn(
                tag=tag,
                domain=domain,
                prompt_tokens=prompt_tokens,
                answer_tokens=max_tokens,
                reasoning_tokens=0,
                temperature=0.0,
                thinking=False,
                tools=False,
                tool_call=False,
                chain=chain,
                output_chain=out,
            ),
        ),
    )


def draw_session(
    tag: str,
    mix: Mix,
    domains: Sequence[str],
    weights: Sequence[float],
    answer_tokens: tuple[int, int],
    reasoning: ReasoningModel | None,
) -> Session:
    """Everything session `tag` will send, drawn from its own seeded stream."""
    rng = random.Random(tag)
    domain = rng.choices(list(domains), list(weights))[0]
    u = rng.random()
    kind = "chat" if u < mix.chat else "agent" if u < mix.chat + mix.agent else "single"
    thinking = rng.random() < mix.thinking
    temps, tw = zip(*mix.temperatures, strict=False)
    temperature = float(rng.choices(temps, tw)[0])
    long_doc = _uniform(rng, mix.long_tokens) if rng.random() < mix.long_context else 0
    n_turns = _uniform(rng, mix.turns) if kind == "chat" else _uniform(rng, mix.tool_calls) if kind == "agent" else 1
    history: list[int] = []
    tokens = 0
    if kind != "single":  # a shared system prompt: same tokens for every session of this app
        app = rng.randrange(mix.system_prompts)
        bounds = mix.agent_system_tokens if kind == "agent" else mix.system_tokens
        sys_rng = random.Random(f"system:{kind}:{app}")
        tokens = _uniform(sys_rng, bounds)
        history = chain_from_tokens(tokens, f"system:{kind}:{app}")
    turns: list[Turn] = []
    delay = 0.0
    for k in range(n_turns):
        t_tag = f"{tag}:{k}"
        added = (
            _uniform(rng, mix.tool_result_tokens) if kind == "agent" and k else _uniform(rng, mix.prompt_tokens)
        ) + (long_doc if k == 0 else 0)
        tokens += added
        chain = chain_from_tokens(tokens, t_tag, history)
        last = k == n_turns - 1
        tool_call = kind == "agent" and not last
        answer = _uniform(rng, TOOL_CALL_TOKENS) if tool_call else _uniform(rng, answer_tokens)
        # drawn only when asked for: mixes without rewrites keep their random streams
        rewrite = kind == "chat" and k > 0 and mix.rewrite > 0 and rng.random() < mix.rewrite
        if rewrite:
            answer = turns[-1].answer_tokens
        think = reasoning_tokens(reasoning, domain, prompt_key(t_tag)) if thinking else 0
        out = chain_from_tokens(tokens + think + answer, t_tag + ":out", chain)
        turns.append(
            Turn(
                tag=t_tag,
                domain=domain,
                prompt_tokens=tokens,
                answer_tokens=answer,
                reasoning_tokens=think,
                temperature=temperature,
                thinking=thinking,
                tools=kind == "agent",
                tool_call=tool_call,
                chain=tuple(chain),
                output_chain=tuple(out),
                delay_s=delay,
                copy_of=turns[-1].tag if rewrite else "",
                copy_tokens=turns[-1].answer_tokens if rewrite else 0,
            )
        )
        # The next turn's history: this prompt, then the answer as the client re-sends it: with
        # reasoning only inside an agent loop (see the module docstring), so a thinking chat turn
        # diverges from what the server cached right after this prompt.
        history = chain_from_tokens(tokens + answer, t_tag + ":resent", chain) if think and kind != "agent" else out
        tokens += answer + (think if kind == "agent" else 0)
        delay = (
            rng.expovariate(1 / mix.tool_s)
            if kind == "agent" and mix.tool_s > 0
            else rng.expovariate(1 / mix.think_s)
            if mix.think_s > 0
            else 0.0
        )
    return Session(tag=tag, kind=kind, domain=domain, turns=tuple(turns))
