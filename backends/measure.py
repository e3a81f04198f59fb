"""A short measurement of a live backend, taken when the gateway starts, to seed its policy.

The policies' priors are the studies' figures; on another machine, another model or a twin with
other physics they are a head start for some backends and a handicap for others. A few requests
tell the truth about each backend before real traffic does (gateway/seeding.py takes them at
start-up, `Goodput.seed` applies them, `specroute backends check` prints them):

- one streamed greedy request per prompt domain (math, code, chat) with `return_spec_tokens_details`:
  tokens per verify pass (completion_tokens / spec_verify_ct) per domain, and seconds per decode
  pass ((last token - first token) / passes after the first);
- one request with a long prompt and `max_tokens: 1` beside the short ones (after a discarded
  warm-up request): TTFT of the long prompt minus TTFT of the short ones over their token
  difference is the prefill cost per token.

Requests run one at a time on an otherwise idle backend (the figures are at batch 1), with
temperature 0 and thinking off so that reasoning length does not vary the time, on the backend's
own pooled client (`SGLangClient`). The prompts are this module's own, apart from loadgen's
datasets and the twin's calibration prompts; their keys are the prompt domains the policies
classify requests into (`policies.base.Domain`'s values).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import aiohttp
import msgspec

from backends.client import SGLangClient

__all__ = ["PROMPTS", "Measurement", "MeasurementFailed", "measure"]

PROMPTS: dict[str, str] = {
    "math": "A tank holds 240 litres and drains at 6 litres per minute while a pipe refills it at 2 litres "
    "per minute. How many minutes until it is empty? Show the steps.",
    "code": "Write a Python function that merges two sorted lists into one sorted list without using sort(), "
    "with a docstring and two doctests.",
    "chat": "Describe a quiet morning walk along a river in early autumn, in a short paragraph.",
}
# ~4,000 tokens at the gateway's 4 characters per token: long enough that prefill dominates TTFT.
_LONG = "The committee reviewed the quarterly figures for each regional office and noted the trends. " * 175


class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    step_s: float | None = None  # seconds per decode/verify pass, one request in flight
    accept_length: dict[str, float] = {}  # tokens per verify pass (bonus included), per prompt domain, temperature 0
    prefill_base_s: float | None = None  # TTFT of an (almost) empty prompt, idle backend
    prefill_per_token_s: float | None = None  # extra TTFT per prompt token

    def problems(self) -> list[str]:
        """What is implausible about it (empty: usable)."""
        out = []
        if self.step_s is not None and not (math.isfinite(self.step_s) and 1e-5 <= self.step_s <= 60):
            out.append(f"step_s {self.step_s} outside [1e-5, 60]")
        for dom, a in self.accept_length.items():
            if not (math.isfinite(a) and 1.0 <= a <= 64.0):
                out.append(f"accept_length[{dom}] {a} outside [1, 64]")
        for name in ("prefill_base_s", "prefill_per_token_s"):
            x = getattr(self, name)
            if x is not None and not (math.isfinite(x) and 0 <= x <= 600):
                out.append(f"{name} {x} outside [0, 600]")
        return out


class MeasurementFailed(Exception):
    """The backend could not be measured (the caller keeps its prior); the message says why."""


class _Stream(msgspec.Struct):
    """One streamed request: seconds to the first and to the last generated token, usage, sglext."""

    first: float | None = None
    last: float | None = None
    usage: dict[str, Any] = {}
    sglext: dict[str, Any] = {}


async def _post_stream(client: SGLangClient, body: dict[str, Any], timeout_s: float) -> _Stream:
    out = _Stream()
    t0 = time.perf_counter()
    resp = await client.post(
        "/v1/chat/completions", msgspec.json.encode(body), timeouts=aiohttp.ClientTimeout(total=timeout_s)
    )
    try:
        if resp.status != 200:
            raise MeasurementFailed(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                obj = msgspec.json.decode(data)
            except msgspec.DecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            if isinstance(obj.get("error"), dict):
                raise MeasurementFailed(f"stream error: {obj['error'].get('message')}")
            for choice in obj.get("choices") or ():
                delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                    now = time.perf_counter() - t0
                    out.first = now if out.first is None else out.first
                    out.last = now
            if isinstance(obj.get("usage"), dict):
                out.usage = obj["usage"]
            if isinstance(obj.get("sglext"), dict):
                out.sglext = obj["sglext"]
    finally:
        resp.release()  # back to the pool, or closed when the stream was left mid-way (an error event)
    return out


async def measure(
    client: SGLangClient,
    *,
    speculative: bool = True,
    max_tokens: int = 64,
    timeout_s: float = 60.0,
) -> Measurement:
    """Measure the client's backend (its served model). Raises MeasurementFailed, or aiohttp's and
    the OS's errors, when it cannot be measured."""
    common = {
        "model": client.spec.upstream_model,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"thinking": False},
    }
    accept: dict[str, float] = {}
    steps: list[float] = []
    short_ttft: list[tuple[float, int]] = []
    # a first request warms connections and caches up; its times are not kept
    await _post_stream(
        client, {**common, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 2}, timeout_s
    )
    for domain, prompt in PROMPTS.items():
        body = {
            **common,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "return_spec_tokens_details": speculative,
        }
        s = await _post_stream(client, body, timeout_s)
        n = s.usage.get("completion_tokens")
        p = s.usage.get("prompt_tokens")
        if s.first is not None and isinstance(p, int):
            short_ttft.append((s.first, p))
        details = s.sglext.get("spec_tokens_details")
        details = details[0] if isinstance(details, list) and details else details
        verify = details.get("spec_verify_ct") if isinstance(details, dict) else None
        if not isinstance(n, int) or n < 2 or s.first is None or s.last is None or s.last <= s.first:
            continue
        if speculative and isinstance(verify, int) and verify > 1:
            accept[domain] = n / verify
            steps.append((s.last - s.first) / (verify - 1))  # the first pass produced the first token
        elif not speculative:
            steps.append((s.last - s.first) / (n - 1))
    if not short_ttft:
        raise MeasurementFailed("no request produced a token")
    # the long prompt twice, different each time (no cache hit); the faster one counts: a stray
    # delay on a shared machine only ever adds time
    long_first: list[float] = []
    long_usage: dict[str, Any] = {}
    for k in range(2):
        body = {**common, "messages": [{"role": "user", "content": f"{k}: {_LONG}"}], "max_tokens": 1}
        s = await _post_stream(client, body, timeout_s)
        long_usage = s.usage
        if s.first is not None:
            long_first.append(s.first)
    first = min(long_first) if long_first else None
    base_s = min(t for t, _ in short_ttft)
    short_tokens = statistics.fmean(p for _, p in short_ttft)
    per_token = None
    long_tokens = long_usage.get("prompt_tokens")
    if first is not None and isinstance(long_tokens, int) and long_tokens > short_tokens:
        per_token = max(first - base_s, 0.0) / (long_tokens - short_tokens)
    return Measurement(
        step_s=statistics.median(steps) if steps else None,
        accept_length=accept,
        prefill_base_s=base_s if per_token is not None else None,
        prefill_per_token_s=per_token,
    )
