"""`--dataset trace:PATH`: a recorded trace as requests, sent when the trace says.

Each row of the trace's window (`loadgen.trace_file`) is one request:

- its prompt is `input_tokens` words of text in which the trace's shared prefix blocks are
  identical text (`loadgen.trace_text`), as one user message;
- it thinks or answers at once by K2.6's settings (`loadgen.k26`): a share of requests think at
  temperature 1.0, the rest answer at 0.6, top_p 0.95 both;
- it asks for the trace's output length, times the thinking scale when it thinks, as `max_tokens`
  with `ignore_eos` (the run's default for requests without tools), so the server writes exactly
  that many tokens;
- it is due `at_s / speedup` seconds after the replay starts (`Trace.due_s`).

Prompts are built when their request is about to go (a trace's prompts run to gigabytes of text),
and the replay is deterministic in the seed: the same seed, the same texts and the same modes.
"""

from __future__ import annotations

import msgspec

from loadgen.datasets import Message, Prompt
from loadgen.k26 import DEFAULT_THINKING_SCALE, DEFAULT_THINKING_SHARE, K26Mode, k26_mode, scaled_output
from loadgen.trace_file import Trace, TraceError, TraceSelection, read_trace
from loadgen.trace_text import PromptText

__all__ = ["TRACE_DOMAIN", "TraceOptions", "TraceReplay", "load_trace"]

TRACE_DOMAIN = "chat"  # the traces carry no text; their prompts read as chat (loadgen.trace_text)


class TraceOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What a replay takes from the command line besides the path."""

    selection: TraceSelection = TraceSelection()
    thinking_share: float = DEFAULT_THINKING_SHARE
    thinking_scale: float = DEFAULT_THINKING_SCALE

    def validate(self) -> None:
        self.selection.validate()
        if not 0.0 <= self.thinking_share <= 1.0:
            raise TraceError(f"--thinking-share must be within [0, 1], got {self.thinking_share:g}")
        if not 0.0 < self.thinking_scale <= 100.0:
            raise TraceError(f"--thinking-scale must be within (0, 100], got {self.thinking_scale:g}")


class TraceReplay(msgspec.Struct, frozen=True, kw_only=True):
    trace: Trace
    options: TraceOptions
    seed: int = 0

    def __len__(self) -> int:
        return len(self.trace.rows)

    def mode(self, i: int) -> K26Mode:
        return k26_mode(self.options.thinking_share, self.seed, i)

    def output_tokens(self, i: int) -> int:
        return scaled_output(self.trace.rows[i].output_tokens, self.mode(i).thinking, self.options.thinking_scale)

    def due_s(self, i: int) -> float:
        return self.trace.due_s(self.trace.rows[i])

    def prompt(self, i: int) -> Prompt:
        row = self.trace.rows[i]
        mode = self.mode(i)
        return Prompt(
            messages=(Message("user", PromptText(str(self.seed)).prompt(row)),),
            domain=TRACE_DOMAIN,
            max_tokens=self.output_tokens(i),
            thinking=mode.thinking,
            temperature=mode.temperature,
            top_p=mode.top_p,
        )


def load_trace(path: str, options: TraceOptions | None = None, *, seed: int = 0) -> TraceReplay:
    """Read and check the trace's window; raises TraceError with the file and line."""
    opts = options or TraceOptions()
    opts.validate()
    PromptText.warm()
    return TraceReplay(trace=read_trace(path, opts.selection), options=opts, seed=seed)
