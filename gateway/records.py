"""What one request produced: the upstream's answer as the gateway read it (`Result`), and the one
record per finished request (`RequestRecord`) that the policy learns from and that metrics, traces
and the access log report. The record is built once at the end of the request, off the per-chunk path."""

from __future__ import annotations

from typing import Any

import msgspec

from backends.telemetry import SpecStats, spec_stats
from common.usage import Usage


class Result(msgspec.Struct, kw_only=True):
    """What an upstream answer told the gateway, filled as it arrives: by the SSE relay for a stream,
    from the body for a complete answer. The times are `time.perf_counter()` readings.

    The clock is `common.stream_clock`'s definition: a generated token is one of any kind
    (reasoning, content, tool call, completions text); `t_first_answer` skips reasoning."""

    status: int = 0  # the HTTP status the client got; 0 until the answer starts
    t_first: float | None = None  # first chunk with generated output of any kind
    t_first_answer: float | None = None  # first content, tool call or text
    t_last: float | None = None  # last chunk with generated output
    generated: int = 0  # chunks with generated output so far (a decode or verify pass each)
    usage: Usage | None = None
    sglext: Any = None  # the raw `sglext` object, read once the token count is known
    spec: SpecStats | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    done: bool = False  # a stream's `data: [DONE]` arrived
    error: str | None = None
    error_type: str | None = None
    error_code: Any = None  # `code` of a stream's error event (SGLang: 503 for a full queue)

    def read_spec(self, speculative: bool) -> bool:
        """Spec stats from `sglext` (they need the final token count, which SGLang sends after it);
        returns whether telemetry a speculative backend should have sent is missing."""
        if self.sglext is not None and self.usage is not None and self.usage.completion_tokens is not None:
            self.spec = spec_stats(self.sglext, self.usage.completion_tokens)
        return speculative and self.sglext is None


class RequestRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    request_id: str
    model: str
    kind: str
    stream: bool
    status: int
    duration_s: float  # gateway received -> last byte sent
    max_tokens: int | None = None  # as asked (max_completion_tokens or max_tokens)
    temperature: float | None = None  # as asked
    priority: int | None = None  # as asked: its place in the admission queue (queue_s)
    trace_id: str | None = None
    backend: str | None = None
    strategy: str | None = None
    policy: str | None = None
    reason: str | None = None
    score: float | None = None
    domain: str | None = None
    inflight: int = 0  # on the chosen backend at dispatch, this request included
    attempt: int = 1
    queue_s: float = 0.0  # waiting for capacity (admission)
    # The upstream's usage; None when it reported none (a stream cut before its end, a refusal).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # all generated tokens, reasoning included (over all sequences)
    sequences: int = 1  # generated side by side for it (`n`, a completions batch)
    reasoning_tokens: int | None = None  # of completion_tokens, the thinking segment's (when reported)
    cached_tokens: int | None = None  # of prompt_tokens, served by the prefix cache (when reported)
    ttft_s: float | None = None  # gateway received -> first generated token of any kind
    ttft_answer_s: float | None = None  # gateway received -> first answer token (content, tool call, text)
    decode_s: float | None = None  # first -> last generated token
    decode_tok_s: float | None = None  # per sequence: (completion_tokens / sequences - 1) / decode_s
    tpot_s: float | None = None  # per sequence: (e2e - ttft) / (completion_tokens / sequences - 1)
    accept_length: float | None = None
    verify_ct: int | None = None  # over all sequences
    baseline_tok_s: float | None = None  # the AR backend's expected decode tok/s at the same load
    speedup: float | None = None  # decode_tok_s / baseline_tok_s
    finish_reason: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    error: str | None = None
    error_type: str | None = None
    prompt: str | None = None  # only with logging.include_prompts


_json = msgspec.json.Encoder()


def encode_request(record: RequestRecord) -> bytes:
    """The record as JSON, once per request: the access log line is made of these bytes, and a
    CLIENT span carries the same bytes to the span exporter."""
    return _json.encode(record)  # omit_defaults: unset fields are left out
