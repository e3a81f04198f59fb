"""The raw measurements of a sweep, as kept on disk (JSON) before and whatever the fit makes of them.

Every figure is in the server's own seconds: a twin's wall-clock figures divided by its time
scale (`ServerFacts.time_scale`), a real server's as measured. A sweep that stops early (the
server failed, another client started sending) keeps what it measured so far in the same file,
with `stopped` saying why; `specroute profile fit FILE` fits what it holds.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from tools.fit.discover import ServerFacts

__all__ = ["Level", "Measurements", "Request", "Window", "load_measurements", "save_measurements"]


class Request(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One streamed chat request as the client saw it."""

    domain: str
    temperature: float
    thinking: bool
    prompt_tokens: int = 0  # the server's count (usage)
    completion_tokens: int = 0
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunks: int = 0  # generated chunks
    verify_ct: int | None = None  # sglext: verify passes
    correct_drafts: int | None = None  # sglext: accepted drafts over those passes (before max_tokens cuts)
    error: str | None = None


class Window(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The stretch of a round where all its requests decode together: from the last first token to
    the first finish. `moments` is the change of SGLang's decode moments over it (steps, sum of
    batch, of step time in us, of batch^2, of batch x time, of generated tokens); the client's own
    view of it is `span_s`, the generated chunks and tokens each request received in it, and the
    KV tokens its requests held at its start and end."""

    span_s: float
    moments: list[float] | None = None
    chunks: list[int] = []
    tokens: list[int] = []
    kv_start: int = 0
    kv_end: int = 0


class Level(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One round of `concurrency` requests sent together (or, for prefill, one request alone)."""

    kind: str  # prefill | step | context | accept | lengths
    concurrency: int
    prompt_tokens: int  # the target length (each request's own count is in `requests`)
    max_tokens: int
    temperature: float
    thinking: bool
    ignore_eos: bool
    domains: list[str]
    requests: list[Request] = []
    window: Window | None = None
    prefill_busy_s: float | None = None  # the server's prefill counters over the level
    prefill_tokens: int | None = None
    decode_busy_s: float | None = None  # the server's decode moments' step time over the level
    wall_s: float = 0.0  # wall-clock seconds the round took

    @property
    def server_busy_s(self) -> float | None:
        """Seconds the server computed for the round (prefill and decode), whatever the client's
        machine added: a twin at time scale 1 on a busy machine takes longer in wall-clock time."""
        if self.prefill_busy_s is None or self.decode_busy_s is None:
            return None
        return self.prefill_busy_s + self.decode_busy_s


class Measurements(msgspec.Struct, kw_only=True):
    url: str
    date: str  # ISO date of the sweep
    mode: str  # quick | full
    max_prompt_tokens: int
    facts: ServerFacts
    levels: list[Level] = []
    wall_s: float = 0.0  # wall-clock seconds of the sweep so far
    stopped: str | None = None  # why the sweep ended early; None: it ran to the end
    notes: list[str] = []


def save_measurements(m: Measurements, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(m), indent=1) + b"\n")
    tmp.replace(path)


def load_measurements(path: Path) -> Measurements:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Measurements)
    except msgspec.ValidationError as e:
        raise ValueError(f"{path}: not a measurements file of `specroute profile`: {e}") from None
