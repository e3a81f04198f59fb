"""A short measurement of a live backend, taken when the gateway starts, to seed its policy.

`backends check` probes a server once; this takes the few figures the goodput policy needs so that
it starts from the backend's own physics instead of the studies' priors (`policies.measure`):

- one streamed greedy request per prompt domain (math, code, chat) with `return_spec_tokens_details`:
  tokens per verify pass (completion_tokens / spec_verify_ct) per domain, and seconds per decode
  pass ((last token - first token) / passes after the first);
- one request with a long prompt and `max_tokens: 1` beside the short ones (after a discarded
  warm-up request): TTFT of the long prompt
  minus TTFT of the short ones over their token difference is the prefill cost per token.

Requests run one at a time on an otherwise idle backend (the figures are at batch 1), with
temperature 0 and thinking off so that reasoning length does not vary the time. Synchronous urllib,
as `probe.py`: the gateway runs it in a thread, one per backend. The prompts are this module's own,
apart from loadgen's datasets and the twin's calibration prompts.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from typing import Any

from policies.base import Domain
from policies.measure import Measurement

__all__ = ["PROMPTS", "measure"]

PROMPTS: dict[Domain, str] = {
    Domain.MATH: "A tank holds 240 litres and drains at 6 litres per minute while a pipe refills it at 2 litres "
    "per minute. How many minutes until it is empty? Show the steps.",
    Domain.CODE: "Write a Python function that merges two sorted lists into one sorted list without using sort(), "
    "with a docstring and two doctests.",
    Domain.CHAT: "Describe a quiet morning walk along a river in early autumn, in a short paragraph.",
}
# ~4,000 tokens at the gateway's 4 characters per token: long enough that prefill dominates TTFT.
_LONG = "The committee reviewed the quarterly figures for each regional office and noted the trends. " * 175


def _post_stream(
    base: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float
) -> tuple[float | None, float | None, dict[str, Any], dict[str, Any]]:
    """(seconds to first generated token, seconds to last, usage, sglext) of one streamed request."""
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    t0 = time.perf_counter()
    first = last = None
    usage: dict[str, Any] = {}
    sglext: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                obj = json.loads(data)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if isinstance(obj.get("error"), dict):
                raise RuntimeError(f"stream error: {obj['error'].get('message')}")
            for choice in obj.get("choices") or ():
                delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                    now = time.perf_counter() - t0
                    first = now if first is None else first
                    last = now
            if isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
            if isinstance(obj.get("sglext"), dict):
                sglext = obj["sglext"]
    return first, last, usage, sglext


def measure(
    url: str,
    model: str,
    *,
    api_key: str | None = None,
    speculative: bool = True,
    max_tokens: int = 64,
    timeout_s: float = 60.0,
) -> Measurement:
    """Measure one backend. Raises OSError / RuntimeError when it cannot be measured (the caller
    keeps the prior then)."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    common = {
        "model": model,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"thinking": False},
    }
    accept: dict[Domain, float] = {}
    steps: list[float] = []
    short_ttft: list[tuple[float, int]] = []
    # a first request warms connections and caches up; its times are not kept
    _post_stream(
        base, {**common, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 2}, headers, timeout_s
    )
    for domain, prompt in PROMPTS.items():
        body = {
            **common,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "return_spec_tokens_details": speculative,
        }
        first, last, usage, sglext = _post_stream(base, body, headers, timeout_s)
        n = usage.get("completion_tokens")
        p = usage.get("prompt_tokens")
        if first is not None and isinstance(p, int):
            short_ttft.append((first, p))
        details = sglext.get("spec_tokens_details")
        details = details[0] if isinstance(details, list) and details else details
        verify = details.get("spec_verify_ct") if isinstance(details, dict) else None
        if not isinstance(n, int) or n < 2 or first is None or last is None or last <= first:
            continue
        if speculative and isinstance(verify, int) and verify > 1:
            accept[domain] = n / verify
            steps.append((last - first) / (verify - 1))  # the first pass produced the first token
        elif not speculative:
            steps.append((last - first) / (n - 1))
    if not short_ttft:
        raise RuntimeError("no request produced a token")
    # the long prompt twice, different each time (no cache hit); the faster one counts: a stray
    # delay on a shared machine only ever adds time
    long_first: list[float] = []
    long_usage: dict[str, Any] = {}
    for k in range(2):
        body = {**common, "messages": [{"role": "user", "content": f"{k}: {_LONG}"}], "max_tokens": 1}
        t, _, long_usage, _ = _post_stream(base, body, headers, timeout_s)
        if t is not None:
            long_first.append(t)
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


def measure_quietly(url: str, model: str, **kw: Any) -> Measurement | None:
    """`measure`, or None when the backend could not be measured (logged by the caller)."""
    try:
        return measure(url, model, **kw)
    except (OSError, RuntimeError, urllib.error.URLError, ValueError):
        return None
