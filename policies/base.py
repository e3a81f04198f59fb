"""The policy contract: pure, synchronous, no I/O, cheap. It runs for every request."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from backends import BackendSpec
from backends.measure import Measurement


class Domain(str, enum.Enum):  # noqa: UP042  (StrEnum would change str() in logs and keys)
    MATH = "math"
    CODE = "code"
    CHAT = "chat"


class RequestFeatures(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy may know about a request before it is sent."""

    model: str
    domain: Domain = Domain.CHAT
    prompt_tokens: int = 0
    max_tokens: int | None = None
    stream: bool = False
    temperature: float | None = None  # as asked; None = the server's default
    thinking: bool | None = None  # chat_template_kwargs.thinking; None = the server's default
    tools: bool = False  # the request offers tools
    sequences: int = 1  # decoded side by side for it: `n`, times the prompts of a completions batch
    # Hash chain of the message history's blocks (`policies.prefix.message_blocks`): element i
    # identifies the first i+1 blocks of `prefix.BLOCK_TOKENS` tokens each. Empty = not tracked.
    prefix: tuple[int, ...] = ()
    # Identifies the request's whole message history, so a later turn can name the request whose
    # answer it asks back (`policies.prefix.answer_key`); 0 = not tracked.
    prompt_key: int = 0
    # A copy-heavy turn (`policies.copy`): the `prompt_key` of the request whose answer it asks back
    # changed, which only the server that generated that answer can draft from (NGRAM). 0 = none.
    copy_of: int = 0


# Chunks a stream must have carried before its pace (seconds between chunks) can be read.
PACE_CHUNKS = 2


class StreamProgress(Protocol):
    """How far a running request's stream has come, as its caller reads it: when its first and
    latest generated chunks arrived (in the caller's seconds; None before the first) and how many
    chunks carried output. One chunk is one decode or verify pass (SGLang streams each pass's
    tokens together)."""

    @property
    def t_first(self) -> float | None: ...

    @property
    def t_last(self) -> float | None: ...

    @property
    def generated(self) -> int: ...


class Resident:
    """A request running on a backend, for the TPOT it would lose to another request's prefill:
    its stream's progress and the output tokens it was expected to produce in all, as its decision
    expected them (`Decision.expected_tokens`), else its `max_tokens`, else 0 (unknown)."""

    __slots__ = ("progress", "expected_tokens")

    def __init__(self, progress: StreamProgress, expected_tokens: float, max_tokens: int | None = None) -> None:
        self.progress = progress
        self.expected_tokens = expected_tokens or float(max_tokens or 0)

    @property
    def decoding(self) -> bool:
        """Its stream has carried the two chunks a pace is read from."""
        return self.progress.generated >= PACE_CHUNKS


class BackendView(msgspec.Struct, kw_only=True):
    """A policy's read-only view of one candidate backend at decision time.

    The `reported_*` fields come from the backend itself (SGLang `/v1/loads`, polled in the
    background) and are None until a poll succeeded. They matter with several gateway replicas:
    each replica only counts its own in-flight requests, the backend sees them all.
    `max_running` is SGLang's `max_running_requests` (`/server_info`): beyond it requests queue.
    """

    spec: BackendSpec
    inflight: int = 0  # counted by this gateway, dispatch to stream end
    healthy: bool = True
    reported_running: int | None = None
    reported_waiting: int | None = None
    max_running: int | None = None
    reported_accept_length: float | None = None  # windowed tokens per verify pass; None/0 for AR
    # This gateway's own `inflight` when the report was taken: separates other replicas' load
    # from ours, so that a report older than our last dispatches or completions is not misread.
    reported_inflight: int | None = None
    # SGLang's `max_total_num_tokens` (`/server_info`): the KV budget, which bounds how much of the
    # conversations it served the radix cache can still hold. None: not known.
    kv_tokens: int | None = None
    # Prompt tokens of this gateway's requests here that have not produced their first token yet
    # (queued or prefilling), as each decision predicted them uncached (`Decision.prefill_tokens`).
    # SGLang prefills first come, first served: a new request's first token waits for them.
    pending_prefill: int = 0
    pending_pairs: float = 0.0  # their attention's causal pairs (`policies.prefill.causal_pairs`)
    # This gateway's requests running here (dispatch to end; caller-kept): how close each one's
    # TPOT is to the SLO, which another request's prefill riding in their passes could push past it.
    residents: set[Resident] = msgspec.field(default_factory=set)
    # Prompt tokens, their causal pairs and the prompts of this gateway's requests here that have
    # been prefilled, over the backend's life (caller-kept, counted at each first token), and their
    # values when `prefill_counters` was last polled (None if a prompt of ours was pending then):
    # over a window of the server's counters they say how long the prompts it computed were, which
    # its busy time per token depends on (`policies.server_counters`).
    prefilled_tokens: int = 0
    prefilled_pairs: float = 0.0
    prefilled_prompts: int = 0
    prefilled_at_report: tuple[float, float, float] | None = None
    # SGLang's own cumulative counters from `/v1/loads` (0.5.23), as last polled: `decode_moments`
    # (decode steps, sums of batch, step us, batch^2, batch x us, generated tokens) and
    # (`total_prefill_busy_us`, `total_prefill_uncached_tokens`). Step time and prefill speed
    # measured by the server itself, clean of what other requests did to a request's own timing
    # (`policies.server_counters`). None: not reported.
    decode_moments: tuple[float, ...] | None = None
    prefill_counters: tuple[float, float] | None = None

    @property
    def load(self) -> int:
        """Requests on the backend now, ours and (from its report) other gateways'."""
        return view_load(self)

    @property
    def name(self) -> str:
        return self.spec.name

    def prefill_queued(self, tokens: int, pairs: float) -> None:
        """A request of ours was dispatched here with `tokens` uncached prompt tokens, `pairs`
        causal pairs: pending until its first token."""
        self.pending_prefill += tokens
        self.pending_pairs += pairs

    def prefill_finished(self, tokens: int, pairs: float) -> None:
        """That request's first token came (or it ended): no longer pending, counted prefilled."""
        self.pending_prefill -= tokens
        self.pending_pairs -= pairs
        self.prefilled_tokens += tokens
        self.prefilled_pairs += pairs
        self.prefilled_prompts += 1

    def note_prefill_report(self) -> None:
        """`prefill_counters` were just polled: keep our prefilled counts beside them, only between
        prompts of ours, where they align with the server's (`policies.server_counters`)."""
        self.prefilled_at_report = (
            None
            if self.pending_prefill
            else (float(self.prefilled_tokens), self.prefilled_pairs, float(self.prefilled_prompts))
        )


def view_load(v: BackendView) -> int:
    """Our in-flight count plus what the backend reported beyond ours at its last report.

    Without `reported_inflight` the best guess is the larger of the two counts; a polled
    report lags (a request that just finished still counts), which is why the gateway should
    fill `reported_inflight` when it stores a report.
    """
    local = v.inflight
    running = v.reported_running
    if running is None:
        return local
    reported = running + (v.reported_waiting or 0)
    at = v.reported_inflight
    if at is None:
        return max(local, reported)
    others = reported - at
    return local + others if others > 0 else local


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The chosen backend plus why, for traces and logs."""

    backend: BackendView
    reason: str
    score: float | None = None
    # Prompt tokens the policy expects the backend to prefill (the part its cache does not hold);
    # None: the whole prompt. The caller counts them in `BackendView.pending_prefill` until the
    # request's first token.
    prefill_tokens: int | None = None
    # Output tokens the policy expects the request to produce (each sequence's); 0: no estimate.
    # The caller keeps it with the request among the backend's `residents`.
    expected_tokens: float = 0.0


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """Telemetry record of one finished request, fed back to the policy.

    `inflight_at_dispatch` counts this request too (the lease is taken first), in sequences as
    SGLang's running count is: a request of `n` > 1 counts n. `mean_inflight`,
    when the caller can give it, is the time-weighted mean load of the backend over the request's
    life: under a changing load it says which batch size the decode speed was measured at better
    than the count at dispatch does.
    """

    backend: str
    domain: Domain
    inflight_at_dispatch: int
    mean_inflight: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # over all sequences, as SGLang's usage counts them
    # Sequences generated side by side for the request (`n`, a completions batch): they share its
    # decode passes and each adds one to the batch.
    sequences: int = 1
    ttft_s: float | None = None
    decode_s: float | None = None  # first to last token
    verify_ct: int | None = None  # over all sequences
    accept_length: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, when reported
    # The features the request was routed with: the policy learns per kind of request
    # (temperature band, thinking, tools, context length) from them. None: not given.
    features: RequestFeatures | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """Per sequence."""
        per_sequence = self.completion_tokens / max(self.sequences, 1)
        if self.decode_s and self.decode_s > 0 and per_sequence > 1:
            return (per_sequence - 1) / self.decode_s
        return None


class NoCandidate(Exception):
    """No backend can take the request (empty pool or none healthy)."""


class Policy(Protocol):
    name: str

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision: ...

    def observe(self, outcome: Outcome) -> None: ...


# What some policies can do besides routing; the gateway asks with isinstance.


@runtime_checkable
class Seedable(Protocol):
    """Takes a start-up measurement of a backend (`backends.measure`) in place of its prior."""

    def seed(self, backend: BackendSpec, measurement: Measurement) -> None: ...


@runtime_checkable
class TracksPrefixes(Protocol):
    """Remembers which backend holds which conversation prefix: a restarted or removed backend's
    must be forgotten."""

    def forget_prefixes(self, backend: str) -> None: ...


@runtime_checkable
class Describes(Protocol):
    """Explains its state for `GET /admin/backends` (plain dicts), given the current views."""

    def describe(self, candidates: Sequence[BackendView] | None = None) -> dict[str, Any]: ...
