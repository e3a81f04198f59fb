"""One admitted generation as the HTTP routes see it: admission, token flow, timing, meta_info.

Shared by the OpenAI routes and native `/generate`, so that limits, faults, metrics and
SGLang's `meta_info` are computed in one place whatever the route.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec

from backends.sim.engine import QueueFull, SimRequest
from backends.sim.errors import ApiError
from backends.sim.runtime import Channel
from backends.sim.state import SimState, new_rid
from backends.sim.text import TokenStream

__all__ = ["Generation", "admit"]


class Generation:
    """An admitted request: engine record, channel, deterministic tokens, timing."""

    __slots__ = ("state", "rid", "req", "channel", "tokens", "created", "prompt_tokens",
                 "max_new_tokens", "t_start", "t_first", "t_last", "finish_reason")

    def __init__(self, state: SimState, rid: str, req: SimRequest | None,
                 channel: Channel | None, prompt_tokens: int, max_new_tokens: int) -> None:
        self.state = state
        self.rid = rid
        self.req = req
        self.channel = channel
        self.tokens = TokenStream(req.seed if req is not None else state.rng_seed)
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.t_last = 0.0
        self.finish_reason: str | None = None

    @property
    def completion_tokens(self) -> int:
        return self.req.completion_tokens if self.req is not None else 0

    async def steps(self) -> AsyncIterator[int]:
        """Token counts, one per engine step that produced tokens for this request.

        `finish_reason` (`length` or `abort`) is set before the last step is yielded, so a
        consumer can tell the last step apart; an abort may end the stream without tokens.
        """
        if self.channel is None:
            self.finish_reason = "length"
            return
        metrics = self.state.metrics
        scale = self.state.runtime.time_scale or 1.0
        while True:
            for n, finished, why in await self.channel.get():
                if finished:  # set before the last yield so consumers can spot the last step
                    self.finish_reason = why
                if n:
                    now = time.perf_counter()
                    if metrics is not None:
                        if not self.t_first:
                            metrics.ttft.observe((now - self.t_start) / scale)
                        else:
                            metrics.itl.observe((now - self.t_last) / scale / n)
                    self.t_first = self.t_first or now
                    self.t_last = now
                    yield n
                if finished:
                    if metrics is not None:
                        metrics.e2e.observe((time.perf_counter() - self.t_start) / scale)
                        metrics.requests_total += 1
                    return

    def usage(self) -> dict:
        c = self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": c,
                "total_tokens": self.prompt_tokens + c, "prompt_tokens_details": None,
                "reasoning_tokens": 0}

    def spec_details(self) -> dict | None:
        """SGLang 0.5.23 spec fields, or None (AR server, no verify pass)."""
        if self.req is None:
            return None
        d = self.req.spec_details()
        return msgspec.to_builtins(d) if d is not None else None

    def meta_info(self, finished: bool, completion_tokens: int | None = None) -> dict:
        """Native `meta_info`; speculative fields only on the finished output.

        `completion_tokens` overrides the engine's count for chunks streamed mid-way (the
        engine may already be a step ahead of what the client has received).
        """
        c = self.completion_tokens if completion_tokens is None else completion_tokens
        meta: dict = {"id": self.rid, "finish_reason": None, "prompt_tokens": self.prompt_tokens,
                      "completion_tokens": c, "cached_tokens": 0}
        if not finished:
            return meta
        reason = self.finish_reason or "length"
        if reason == "abort":
            meta["finish_reason"] = {"type": "abort", "message": "Abort request"}
        else:
            meta["finish_reason"] = {"type": "length", "length": c}
        scale = self.state.runtime.time_scale or 1.0
        meta["e2e_latency"] = (time.perf_counter() - self.t_start) / scale
        spec = self.spec_details()
        if spec is not None:
            if self.state.legacy:  # older 0.5.x names
                meta["spec_verify_ct"] = spec["spec_verify_ct"]
                meta["spec_accept_token_num"] = spec["spec_num_correct_drafts"]
                meta["spec_accept_histogram"] = spec["spec_correct_drafts_histogram"]
            else:
                meta.update(spec)
        return meta

    def release(self) -> None:
        """Free the engine slot if the request is still in flight (client gone, error)."""
        self.state.runtime.release(self.rid)


async def admit(state: SimState, rid: str | None, prompt_text: str, prompt_tokens: int,
                max_new_tokens: int) -> Generation:
    """Validate limits, apply fault knobs, submit to the engine. Raises ApiError (4xx/5xx)."""
    if max_new_tokens < 0:
        raise ApiError(f"max_new_tokens must be at least 0, got {max_new_tokens}.",
                       param="max_tokens")
    ctx = state.profile.context_length
    if prompt_tokens + max_new_tokens > ctx:
        raise ApiError(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens."
            f" You requested a total of {prompt_tokens + max_new_tokens} tokens:"
            f" {prompt_tokens} tokens from the input messages and {max_new_tokens} tokens for"
            " the completion. Please reduce the number of tokens in the input messages or the"
            " completion to fit within the limit.")
    await state.faults.before_generation()
    rid = rid or new_rid()
    if max_new_tokens == 0:
        return Generation(state, rid, None, None, prompt_tokens, 0)
    try:
        req, ch = state.runtime.submit(rid, prompt_tokens, max_new_tokens, prompt_text)
    except QueueFull:
        raise ApiError("The request queue is full.", status=503) from None
    except ValueError as e:
        raise ApiError(str(e)) from None
    return Generation(state, rid, req, ch, prompt_tokens, max_new_tokens)
