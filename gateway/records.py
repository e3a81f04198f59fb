"""One record per finished request: what the policy learns from, what metrics, traces and the
access log report. Built once at the end of the request, off the per-chunk path."""

from __future__ import annotations

import msgspec


class RequestRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    request_id: str
    model: str
    kind: str
    stream: bool
    status: int
    duration_s: float                  # gateway received -> last byte sent
    max_tokens: int | None = None      # as asked (max_completion_tokens or max_tokens)
    temperature: float | None = None   # as asked
    trace_id: str | None = None
    backend: str | None = None
    strategy: str | None = None
    policy: str | None = None
    reason: str | None = None
    score: float | None = None
    domain: str | None = None
    inflight: int = 0                  # on the chosen backend at dispatch, this request included
    attempt: int = 1
    queue_s: float = 0.0               # waiting for capacity (admission)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None        # gateway received -> first non-empty content
    decode_s: float | None = None      # first -> last content chunk
    decode_tok_s: float | None = None  # (completion_tokens - 1) / decode_s
    tpot_s: float | None = None        # (e2e - ttft) / (completion_tokens - 1)
    accept_length: float | None = None
    verify_ct: int | None = None
    baseline_tok_s: float | None = None  # the AR backend's expected decode tok/s at the same load
    speedup: float | None = None         # decode_tok_s / baseline_tok_s
    finish_reason: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    error: str | None = None
    error_type: str | None = None
    prompt: str | None = None          # only with logging.include_prompts


_json = msgspec.json.Encoder()


def encode_request(record: RequestRecord) -> bytes:
    """The record as JSON, once per request: the access log line is made of these bytes, and a
    CLIENT span carries the same bytes to the span exporter."""
    return _json.encode(record)  # omit_defaults: unset fields are left out
