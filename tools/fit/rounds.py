"""One round of a sweep: `concurrency` streamed chat requests sent together, timed by the server's
own counters and by the client.

A round's requests start together, so once the last of them is prefilled and until the first of
them finishes, exactly `concurrency` sequences decode together: the round's window. While the
round runs, `/v1/loads` is read again and again (every `POLL_S` of the server's time); the window
is the longest stretch between two reads over which the server's decode moments (SGLang 0.5.23:
steps, and the sums of batch, batch squared and step time) say every step ran the whole round,
and its KV is the server's `num_used_tokens` at both ends. That is the server's own account, right
however late the client reads its streams. A server without decode moments gets the client's
window instead: from the moment the client has every first token to the first finish, the chunks
and tokens each request received in it (a stream sends a chunk per decode step at SGLang's
default `--stream-interval 1`) and the KV its requests held. The prefill counters read before and
after the round give its prefill time. Every duration is divided by the server's time scale (a
twin's; 1 for SGLang). A read that shows more requests than the round has in flight means another
client is sending: `ForeignLoad` ends the round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
import msgspec

from backends.client import SGLangClient
from backends.loads import LoadReport, parse_loads
from common.stream_clock import Chunk, StreamClock, decode_chunk
from tools.fit.discover import ServerFacts, read_load
from tools.fit.measurements import Level, Request, Window
from tools.fit.prompts import PromptMaker

# Between two reads of /v1/loads during a round, in the server's seconds (a twin's time scale shrinks it)
POLL_S = 0.05
POLL_TIMEOUT_S = 30.0  # a server busy with a long prefill answers late (the twin's loop, SGLang's tokenizer)

__all__ = ["ForeignLoad", "LiveRequest", "RoundSpec", "calibrate", "request_body", "run_round", "stream_request"]


class ForeignLoad(RuntimeError):
    """The server runs requests this sweep did not send: it is not idle any more."""


class RoundSpec(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    temperature: float = 0.0
    thinking: bool = False
    # of a thinking round, how many requests (the round's last) are sent with thinking off: one
    # round measures both settings, and lasts as long as its longest (thinking) request
    thinking_off: int = 0
    ignore_eos: bool = True
    domains: tuple[str, ...] = ("math", "code", "chat")

    def thinks(self, i: int) -> bool:
        """Whether the round's `i`-th request is sent with thinking on."""
        return self.thinking and i < self.concurrency - self.thinking_off

    def domain(self, i: int) -> str:
        """The round's `i`-th request's domain: each setting of a mixed round cycles the domains alone."""
        on = self.concurrency - self.thinking_off if self.thinking else self.concurrency
        return self.domains[(i if i < on else i - on) % len(self.domains)]


class _Sglext(msgspec.Struct):
    sglext: dict[str, Any] | None = None


_sglext = msgspec.json.Decoder(_Sglext)


class LiveRequest:
    """One request in flight: what the window's snapshots read of it."""

    __slots__ = ("clock", "chunks", "tokens", "prompt_tokens", "finished", "sglext", "error")

    def __init__(self, t_start: float) -> None:
        self.clock = StreamClock(t_start=t_start)
        self.chunks = 0
        self.tokens = 0
        self.prompt_tokens = 0
        self.finished = False
        self.sglext: dict[str, Any] | None = None
        self.error: str | None = None


def request_body(facts: ServerFacts, spec: RoundSpec, prompt: str, thinking: bool | None = None) -> dict[str, Any]:
    """The chat request of a round; `thinking` (default: the round's) switches the model's thinking."""
    thinking = spec.thinking if thinking is None else thinking
    body: dict[str, Any] = {
        "model": facts.served_model_name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": spec.ignore_eos,
    }
    if facts.classification is not None and facts.classification.reported is not None:
        body["return_spec_tokens_details"] = True
    # The thinking switch of Kimi's and DeepSeek's chat templates, and of Qwen's (a template ignores
    # the other's). Sent whether or not the server has a reasoning parser: a model that thinks by
    # default thinks without one too, its reasoning then inside the content.
    body["chat_template_kwargs"] = {"thinking": thinking, "enable_thinking": thinking}
    return body


async def stream_request(
    client: SGLangClient, body: dict[str, Any], live: LiveRequest, events: asyncio.Queue[str], timeout_s: float
) -> None:
    seen_first = False
    try:
        resp = await client.post(
            "/v1/chat/completions", msgspec.json.encode(body), timeouts=aiohttp.ClientTimeout(total=timeout_s)
        )
        try:
            if resp.status != 200:
                text = (await resp.read())[:300].decode("utf-8", "replace")
                live.error = f"HTTP {resp.status}: {text}"
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk: Chunk = decode_chunk(payload)
                except msgspec.DecodeError:
                    continue
                if chunk.usage is not None:
                    live.prompt_tokens = chunk.usage.prompt_tokens or live.prompt_tokens
                if live.clock.observe(chunk, now):
                    live.chunks += 1
                    if chunk.usage is not None and chunk.usage.completion_tokens is not None:
                        live.tokens = chunk.usage.completion_tokens
                    if not seen_first:
                        seen_first = True
                        events.put_nowait("first")
                if b'"sglext"' in payload:
                    live.sglext = _sglext.decode(payload).sglext
                if live.clock.error is not None:
                    live.error = f"stream error: {live.clock.error.message}"
                    return
        finally:
            resp.release()
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        live.error = f"{type(e).__name__}: {e}".rstrip(": ")
    finally:
        live.finished = True
        if not seen_first:
            events.put_nowait("first")
        events.put_nowait("done")


def _spec_counts(sglext: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(verify passes, accepted drafts) from a response's `sglext`, summed over its sequences."""
    if not isinstance(sglext, dict):
        return None, None
    details = sglext.get("spec_tokens_details")
    entries = details if isinstance(details, list) else [details]
    verify = 0
    correct: int | None = 0
    for e in entries:
        if not isinstance(e, dict):
            return None, None
        v, c = e.get("spec_verify_ct"), e.get("spec_num_correct_drafts")
        if type(v) is not int or v <= 0:
            return None, None
        verify += v
        correct = correct + c if correct is not None and type(c) is int and c >= 0 else None
    return verify, correct


def _request(spec: RoundSpec, i: int, live: LiveRequest, scale: float) -> Request:
    f = live.clock.figures()
    verify, correct = _spec_counts(live.sglext)
    e2e = (live.clock.t_last - live.clock.t_start) / scale if live.clock.t_last is not None else None
    return Request(
        domain=spec.domain(i),
        temperature=spec.temperature,
        thinking=spec.thinks(i),
        prompt_tokens=f.prompt_tokens or live.prompt_tokens,
        completion_tokens=f.completion_tokens or 0,
        reasoning_tokens=f.reasoning_tokens,
        cached_tokens=f.cached_tokens,
        finish_reason=live.clock.finish_reason,
        ttft_s=f.ttft / scale if f.ttft is not None else None,
        e2e_s=e2e,
        chunks=live.chunks,
        verify_ct=verify,
        correct_drafts=correct,
        error=live.error,
    )


class _Client(msgspec.Struct):
    """What the client had received of every request at one moment (the fallback window's ends)."""

    t: float
    chunks: list[int]
    tokens: list[int]
    kv: int


def _client(lives: list[LiveRequest]) -> _Client:
    # every request of the round: one that just finished was in the batch until its last step
    return _Client(
        t=time.perf_counter(),
        chunks=[x.chunks for x in lives],
        tokens=[x.tokens for x in lives],
        kv=sum(x.prompt_tokens + x.tokens for x in lives),
    )


class _Poll(msgspec.Struct, frozen=True):
    t: float
    running: int
    used_tokens: int
    moments: tuple[float, ...] | None


def _used_tokens(data: Any) -> int:
    loads = data.get("loads") if isinstance(data, dict) else None
    total = 0
    for rank in loads if isinstance(loads, list) else ():
        v = rank.get("num_used_tokens") if isinstance(rank, dict) else None
        total += v if type(v) is int else 0
    return total


async def _poll(
    client: SGLangClient,
    facts: ServerFacts,
    lives: list[LiveRequest],
    stop: asyncio.Event,
    out: list[_Poll],
    interval_s: float,
) -> None:
    """`/v1/loads` again and again while the round runs: its decode moments, running count and KV in
    use. Raises ForeignLoad when the server runs more requests than the round has in flight."""
    while not stop.is_set():
        # counted before asking: a request that ends while the answer is on its way is still the server's
        in_flight = sum(1 for x in lives if not x.finished)
        try:
            status, raw = await client.get("/v1/loads?include=core", timeout_s=POLL_TIMEOUT_S)
        except (aiohttp.ClientError, OSError, TimeoutError):
            continue  # a read that failed or came late is a point fewer, not a broken round
        data = json.loads(raw) if status == 200 else None
        report = parse_loads(data)
        if report is not None and report.running is not None and report.waiting is not None:
            if report.running + report.waiting > in_flight:
                raise ForeignLoad(
                    f"the server reports {report.running} running and {report.waiting} waiting requests while this "
                    f"sweep has {in_flight} in flight: another client is sending requests"
                )
            out.append(_Poll(time.perf_counter(), report.running, _used_tokens(data), report.decode_moments))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


def _delta(a: tuple[float, ...], b: tuple[float, ...]) -> list[float]:
    return [y - x for x, y in zip(a, b, strict=True)]


def _steady(d: list[float], batch: int) -> bool:
    """Every decode step between two polls ran exactly `batch` sequences (or there was none)."""
    n = d[0]
    if n < 0.5:
        return True
    mean = d[1] / n
    return abs(mean - batch) < 1e-6 and d[3] / n - mean * mean < 1e-6


def _server_window(polls: list[_Poll], batch: int, scale: float) -> Window | None:
    """The longest stretch between polls over which every step ran the whole round (the server's
    own account, whatever the client had read by then)."""
    best: tuple[float, int, int] | None = None
    start: int | None = None
    for k, p in enumerate(polls):
        if p.moments is None or p.running != batch:
            start = None
            continue
        if start is not None and polls[start].moments is not None:
            prev = polls[k - 1].moments
            if prev is None or not _steady(_delta(prev, p.moments), batch):
                start = k
        else:
            start = k
        first = polls[start].moments
        assert first is not None
        steps = p.moments[0] - first[0]
        if steps >= 2 and (best is None or steps > best[0]):
            best = (steps, start, k)
    if best is None:
        return None
    _, i, j = best
    a, b = polls[i], polls[j]
    assert a.moments is not None and b.moments is not None
    moments = _delta(a.moments, b.moments)
    moments[2] /= scale  # step time, us
    moments[4] /= scale  # batch x step time
    return Window(span_s=(b.t - a.t) / scale, moments=moments, kv_start=a.used_tokens, kv_end=b.used_tokens)


def _client_window(a: _Client, b: _Client, scale: float) -> Window:
    return Window(
        span_s=(b.t - a.t) / scale,
        chunks=[y - x for x, y in zip(a.chunks, b.chunks, strict=True)],
        tokens=[y - x for x, y in zip(a.tokens, b.tokens, strict=True)],
        kv_start=a.kv,
        kv_end=b.kv,
    )


def _prefill(before: LoadReport | None, after: LoadReport | None, scale: float) -> tuple[float | None, int | None]:
    p, q = (before.prefill_counters if before else None), (after.prefill_counters if after else None)
    if p is None or q is None:
        return None, None
    return (q[0] - p[0]) / 1e6 / scale, int(q[1] - p[1])


def _decode_busy(before: LoadReport | None, after: LoadReport | None, scale: float) -> float | None:
    """Seconds the server spent in decode steps between two reads (its decode moments' step time)."""
    a, b = (before.decode_moments if before else None), (after.decode_moments if after else None)
    if a is None or b is None:
        return None
    return (b[2] - a[2]) / 1e6 / scale


async def run_round(
    client: SGLangClient,
    facts: ServerFacts,
    maker: PromptMaker,
    spec: RoundSpec,
    *,
    timeout_s: float = 900.0,
    prompts: list[str] | None = None,
) -> Level:
    """Send the round's requests together and measure them (see the module docstring). `prompts`:
    send these instead of new ones (a round repeating an earlier one's); the prompts sent are kept
    in `maker.last_round`. Raises ForeignLoad when the server runs more requests than the round sent."""
    scale = facts.time_scale
    domains = [spec.domain(i) for i in range(spec.concurrency)]
    if prompts is None:
        prompts = [maker.make(d, spec.prompt_tokens) for d in domains]
    maker.last_round = list(prompts)
    before = await read_load(client, facts)
    events: asyncio.Queue[str] = asyncio.Queue()
    t0 = time.perf_counter()
    lives = [LiveRequest(t0) for _ in domains]
    tasks = [
        asyncio.create_task(
            stream_request(client, request_body(facts, spec, p, spec.thinks(i)), live, events, timeout_s)
        )
        for i, (p, live) in enumerate(zip(prompts, lives, strict=True))
    ]
    polls: list[_Poll] = []
    stop = asyncio.Event()
    poller = (
        asyncio.create_task(_poll(client, facts, lives, stop, polls, POLL_S * scale))
        if facts.load_path == "/v1/loads" and spec.max_tokens > 1
        else None
    )
    client_window: Window | None = None
    try:
        first = done = 0
        a: _Client | None = None
        n = spec.concurrency
        while done < n:
            ev = await events.get()
            if ev == "first":
                first += 1
            else:
                done += 1
            if poller is not None and poller.done():
                poller.result()  # a ForeignLoad ends the round
            if a is None and first == n and done == 0 and spec.max_tokens > 1:
                a = _client(lives)
            elif a is not None and client_window is None and done >= 1:
                client_window = _client_window(a, _client(lives), scale)
        await asyncio.gather(*tasks)
        stop.set()
        if poller is not None:
            await poller
    finally:
        stop.set()
        for t in [*tasks, *([poller] if poller is not None else [])]:
            t.cancel()
    window = _server_window(polls, spec.concurrency, scale) or client_window
    wall = time.perf_counter() - t0
    after = await read_load(client, facts)
    busy, computed = _prefill(before, after, scale)
    decoding = _decode_busy(before, after, scale)
    return Level(
        kind=spec.kind,
        concurrency=spec.concurrency,
        prompt_tokens=spec.prompt_tokens,
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        thinking=spec.thinking,
        ignore_eos=spec.ignore_eos,
        domains=list(spec.domains),
        requests=[_request(spec, i, live, scale) for i, live in enumerate(lives)],
        window=window,
        prefill_busy_s=busy,
        prefill_tokens=computed,
        decode_busy_s=decoding,
        wall_s=wall,
    )


async def calibrate(client: SGLangClient, facts: ServerFacts, maker: PromptMaker, tokens: int = 2000) -> Level:
    """Set `maker`'s characters per token to the server tokenizer's on the sweep's text: one request
    of about `tokens` tokens, `max_tokens` 1. The round is returned (its request may have failed)."""
    level = await run_round(
        client, facts, maker, RoundSpec(kind="warmup", concurrency=1, prompt_tokens=tokens, max_tokens=1)
    )
    got = level.requests[0].prompt_tokens
    if got > 0 and not level.requests[0].error:
        maker.chars_per_token = maker.chars_per_token * got / tokens
    return level
