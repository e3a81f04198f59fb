"""Where a phase's sessions come from when it names a source instead of drawing them from its mix.

- `TraceSource`: a recorded trace (`loadgen.trace_file`), replayed on the virtual clock with the
  semantics loadgen gives it over HTTP (`loadgen.trace_dataset`): every row is one request sent at
  its own arrival time (`arrival_times`), its prompt's prefix chain follows the trace's block ids
  (a Mooncake hash id is the same 512 tokens wherever it appears, so prompts share cached
  prefixes exactly where the trace says they agree), its output is the trace's length (x the
  thinking scale when it thinks, K2.6's settings decide which requests think, `loadgen.k26`), and
  its client states that length as `max_tokens`, as loadgen's `ignore_eos` replay does.
- `AgenticSource`: coding-agent loops of the Copilot-derived shape (`loadgen.agentic`), each call
  a turn of a session: the shared system prompt, the loop's growing context, tool calls, copy-heavy
  edits (`Turn.copy`), the tool's run time between calls.

Both are msgspec structs inside the phase, so a phase with a source is encoded, hashed and sent
to worker processes like any other; the trace itself is read once per process.
"""

from __future__ import annotations

import functools
import zlib

import msgspec

from evaluate.workload import Session, Turn
from loadgen.agentic import AGENTIC_DOMAIN, AgentShape, draw_loop
from loadgen.k26 import DEFAULT_THINKING_SCALE, DEFAULT_THINKING_SHARE, k26_mode, scaled_output
from loadgen.trace_dataset import TRACE_DOMAIN, TraceOptions
from loadgen.trace_file import BLOCK_TOKENS, Trace, TraceRow, read_trace
from twin.prefix_cache import chain_from_tokens

__all__ = ["AgenticSource", "Source", "TraceSource", "row_chain"]


class TraceSource(msgspec.Struct, frozen=True, kw_only=True, tag="trace"):
    path: str
    options: TraceOptions = TraceOptions()

    @property
    def trace(self) -> Trace:
        return _read(self.path, self.options)

    @property
    def requests(self) -> int:
        return len(self.trace.rows)

    @property
    def duration_s(self) -> float:
        """Virtual seconds the replay's arrivals span (the window at the speed-up)."""
        return self.trace.replay_s

    @property
    def rate(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def mean_turns(self) -> float:
        return 1.0

    def arrival_times(self) -> list[float]:
        """Each request's send time, seconds after the phase starts."""
        t = self.trace
        return [t.due_s(r) for r in t.rows]

    def session(self, tag: str, index: int, seed: int) -> Session:
        """Request `index` of the trace (modulo its length: a closed loop cycles through it)."""
        rows = self.trace.rows
        i = index % len(rows)
        row = rows[i]
        mode = k26_mode(self.options.thinking_share, seed, i)
        total = scaled_output(row.output_tokens, mode.thinking, self.options.thinking_scale)
        answer = min(row.output_tokens, total)
        chain = _chains(self.path, self.options).get(i, row)
        turn = Turn(
            tag=tag,
            domain=TRACE_DOMAIN,
            prompt_tokens=row.input_tokens,
            answer_tokens=answer,
            reasoning_tokens=total - answer,
            temperature=mode.temperature,
            top_p=mode.top_p,
            thinking=mode.thinking,
            tools=False,
            tool_call=False,
            chain=chain,
            output_chain=tuple(chain_from_tokens(row.input_tokens + total, tag + ":out", chain)),
        )
        return Session(tag=tag, kind="trace", domain=TRACE_DOMAIN, turns=(turn,), exact_length=True)


class AgenticSource(msgspec.Struct, frozen=True, kw_only=True, tag="agentic"):
    shape: AgentShape = AgentShape()
    thinking_share: float = DEFAULT_THINKING_SHARE
    thinking_scale: float = DEFAULT_THINKING_SCALE

    @property
    def mean_turns(self) -> float:
        return self.shape.mean_calls

    def session(self, tag: str, index: int, seed: int) -> Session:
        """Loop `tag` as a session of calls; `index` (its arrival) picks thinking or instant."""
        loop = draw_loop(tag, self.shape)
        mode = k26_mode(self.thinking_share, seed, index)
        history = chain_from_tokens(loop.system_tokens, f"system:agentic:{loop.app}")
        tokens = loop.system_tokens
        turns: list[Turn] = []
        for k, call in enumerate(loop.calls):
            t_tag = f"{tag}:{k}"
            tokens += call.added_tokens
            chain = chain_from_tokens(tokens, t_tag, history)
            total = scaled_output(call.output_tokens, mode.thinking, self.thinking_scale)
            out = chain_from_tokens(tokens + total, t_tag + ":out", chain)
            turns.append(
                Turn(
                    tag=t_tag,
                    domain=AGENTIC_DOMAIN,
                    prompt_tokens=tokens,
                    answer_tokens=call.output_tokens,
                    reasoning_tokens=total - call.output_tokens,
                    temperature=mode.temperature,
                    top_p=mode.top_p,
                    thinking=mode.thinking,
                    tools=True,
                    tool_call=call.kind != "answer",
                    copy=call.kind == "copy",
                    chain=tuple(chain),
                    output_chain=tuple(out),
                    delay_s=call.delay_s,
                )
            )
            # inside a tool loop the next call re-sends this one's output, reasoning included
            history, tokens = out, tokens + total
        return Session(tag=tag, kind="agent", domain=AGENTIC_DOMAIN, turns=tuple(turns))


Source = TraceSource | AgenticSource


def row_chain(row: TraceRow) -> tuple[int, ...]:
    """The prefix chain (64-token blocks, `twin.prefix_cache`) of a trace row's prompt: block j of
    512 tokens is derived from its id and position, so two rows agree exactly as far as their ids
    do; rows without ids get ids of their own."""
    keys = [f"b{b}" for b in row.blocks] if row.blocks else [f"r{row.line}:{j}" for j in range(_blocks(row))]
    chain: list[int] = []
    for j, key in enumerate(keys):
        chain = chain_from_tokens(min(row.input_tokens, (j + 1) * BLOCK_TOKENS), key, chain)
    return tuple(chain)


def _blocks(row: TraceRow) -> int:
    return -(-row.input_tokens // BLOCK_TOKENS)


@functools.lru_cache(maxsize=4)
def _read(path: str, options: TraceOptions) -> Trace:
    return read_trace(path, options.selection)


class _ChainCache:
    """Row chains of one trace, computed when first needed (a full trace's run to millions of
    hashes; every contestant of a run replays the same rows)."""

    def __init__(self) -> None:
        self._chains: dict[int, tuple[int, ...]] = {}

    def get(self, i: int, row: TraceRow) -> tuple[int, ...]:
        chain = self._chains.get(i)
        if chain is None:
            chain = self._chains[i] = row_chain(row)
        return chain


@functools.lru_cache(maxsize=4)
def _chains(path: str, options: TraceOptions) -> _ChainCache:
    return _ChainCache()


def stable_index(tag: str) -> int:
    """An integer from a session tag, for sources' per-session draws outside an arrival order."""
    return zlib.crc32(tag.encode())
