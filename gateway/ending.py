"""How a request ended: its single record and what a policy learns from it, made by one function.

`conclude` reads the request whole (gateway.request: what it asked, where its last attempt went, what
came back) and derives its timing once. TTFT runs from the request's receipt for the record, from
the dispatch for the policy. The decode time is the span from the first to the last generated token
when the stream's chunk times show the pace; without them (a complete answer, or a stream whose
output was held back) the record has none and the policy takes the upstream's whole answer time,
which includes prefill and queueing and so slightly understates the decode speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.errors import ApiError
from gateway.openai_request import Kind
from gateway.records import RequestRecord, Result
from gateway.request import Request
from policies import Outcome

__all__ = ["LOGGED_CHARS", "SHUTDOWN_MESSAGE", "conclude", "refused_record", "settle"]

LOGGED_CHARS = 4096  # of a prompt or an error message, in the record (access log, span)
SHUTDOWN_MESSAGE = "the gateway is shutting down: retry the request"

# (model, domain, load) -> the AR backend's expected decode tok/s there (gateway.baseline)
Baseline = Callable[[str, str, int], float | None]


def settle(result: Result, ending: BaseException | None, shut_down: bool) -> None:
    """What the way the request ended says about its answer: an error it got (ApiError), its client
    leaving or the gateway shutting down (a stream's 200 was sent already, and stays its status),
    or a bug. None: it ended as its answer says."""
    if ending is None:
        return
    if isinstance(ending, ApiError):
        result.status, result.error, result.error_type = ending.status, ending.message, ending.type
    elif isinstance(ending, asyncio.CancelledError):
        if shut_down:
            result.status = result.status or 503
            result.error, result.error_type = SHUTDOWN_MESSAGE, "gateway_shutdown"
        else:
            result.status = result.status or 499
            result.error, result.error_type = "client disconnected", "client_disconnected"
    else:
        result.status = result.status or 500
        result.error, result.error_type = "internal gateway error", type(ending).__name__


def conclude(
    req: Request, now: float, baseline: Baseline, include_prompts: bool
) -> tuple[RequestRecord, Outcome | None]:
    """The request's record, and the outcome of its last attempt for the policy (None when no
    attempt was dispatched). `now`: the end, as `time.perf_counter()`."""
    result, parsed = req.result, req.parsed
    u, spec, t_first, t_last = result.usage, result.spec, result.t_first, result.t_last
    sequences = parsed.sequences
    per_sequence = ((u.completion_tokens if u else None) or 0) / sequences  # sequences decode side by side
    timed = not held_back(req, result)
    decode_s = (t_last - t_first) if timed and t_first is not None and t_last is not None else None
    decode_tok_s = (per_sequence - 1) / decode_s if decode_s and per_sequence > 1 else None
    backend, decision, inflight = req.backend, req.decision, req.inflight
    domain = req.features.domain.value
    baseline_tok_s = speedup = None
    if decode_tok_s is not None:
        baseline_tok_s = baseline(req.model, domain, max(1, inflight))
        speedup = decode_tok_s / baseline_tok_s if baseline_tok_s else None
    record = RequestRecord(
        request_id=req.request_id,
        trace_id=req.trace_id,
        model=req.model,
        kind=req.kind,
        max_tokens=parsed.max_output_tokens if req.kind == "responses" else parsed.max_tokens,
        temperature=parsed.temperature,
        priority=parsed.priority,
        stream=parsed.stream,
        status=result.status,
        duration_s=now - req.t_received,
        backend=backend.name if backend else None,
        strategy=backend.spec.strategy.value if backend else None,
        policy=req.policy.name,
        reason=decision.reason if decision else None,
        score=decision.score if decision else None,
        domain=domain,
        inflight=inflight,
        attempt=len(req.tried) or 1,
        queue_s=req.queue_s,
        prompt_tokens=u.prompt_tokens if u else None,
        completion_tokens=u.completion_tokens if u else None,
        sequences=sequences,
        reasoning_tokens=u.reasoning_tokens if u else None,
        cached_tokens=u.cached_tokens if u else None,
        ttft_s=(t_first - req.t_received) if t_first is not None else None,
        ttft_answer_s=(result.t_first_answer - req.t_received) if result.t_first_answer is not None else None,
        decode_s=decode_s,
        decode_tok_s=decode_tok_s,
        tpot_s=(now - t_first) / (per_sequence - 1) if timed and t_first is not None and per_sequence > 1 else None,
        accept_length=spec.accept_length if spec else None,
        verify_ct=spec.verify_ct if spec else None,
        baseline_tok_s=baseline_tok_s,
        speedup=speedup,
        finish_reason=result.finish_reason,
        response_id=result.response_id,
        response_model=result.response_model,
        error=result.error[:LOGGED_CHARS] if result.error is not None else None,
        error_type=result.error_type,
        prompt=parsed.prompt_text[:LOGGED_CHARS] if include_prompts else None,
    )
    if backend is None:
        return record, None
    untimed = not parsed.stream or not timed  # no chunk times: the whole answer's time stands in
    outcome = Outcome(
        backend=backend.name,
        domain=req.features.domain,
        inflight_at_dispatch=inflight,
        prompt_tokens=record.prompt_tokens or 0,
        completion_tokens=record.completion_tokens or 0,
        sequences=sequences,
        ttft_s=(t_first - req.t_dispatch) if t_first is not None and not untimed else None,
        decode_s=decode_s if decode_s is not None else (now - req.t_dispatch if untimed else None),
        verify_ct=record.verify_ct,
        accept_length=record.accept_length,
        finish_reason=result.finish_reason,
        error=result.error_type if result.error else None,
        mean_inflight=req.mean_inflight,
        cached_tokens=record.cached_tokens,
        reasoning_tokens=record.reasoning_tokens,
        features=req.features,
    )
    return record, outcome


def held_back(req: Request, result: Result) -> bool:
    """Whether a stream's chunk times hide its decode pace: SGLang's tool-call parsers buffer the
    tokens of a call until they can parse it (`function_call/*_detector.py`,
    `parse_streaming_increment`), and its Responses API sends a request with tools its output
    events only at the end (`serving_responses.py`). Then the first token arrives late and the
    rest in a burst: a decode speed from those times is fiction (measured: 1.6M tok/s)."""
    return result.finish_reason == "tool_calls" or (req.kind == "responses" and req.parsed.tools)


def refused_record(
    kind: Kind, error: ApiError, duration_s: float, request_id: str, trace_id: str | None = None, model: str = ""
) -> RequestRecord:
    """The record of a request refused before it could be read whole (its body, its fields, its
    model): it counts in the access log and the metrics like any other."""
    return RequestRecord(
        request_id=request_id,
        trace_id=trace_id,
        model=model,
        kind=kind,
        stream=False,
        status=error.status,
        duration_s=duration_s,
        error=error.message[:LOGGED_CHARS],
        error_type=error.type,
    )
