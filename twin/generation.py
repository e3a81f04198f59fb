"""One admitted generation as the HTTP routes see it: admission, token flow, timing, meta_info.

Shared by the OpenAI routes and native `/generate`, so that limits, faults, metrics, the prefix
cache and SGLang's `meta_info` are computed in one place whatever the route.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from common.priority import priority_in_range
from twin.chat_output import EOS_TOKEN_ID
from twin.chunks import usage_info
from twin.engine import QUEUE_FULL_MESSAGE, RequestAborted, SimRequest
from twin.errors import ApiError, SchedulerAbort, TokenizerError
from twin.lora import Lease, LoraPath
from twin.ngram import echo_share, fingerprints
from twin.prefix_cache import chain_from_text, namespace_root
from twin.protocol import CHAT_DEFAULT_MAX_TOKENS
from twin.runtime import Channel
from twin.state import SimState, new_rid
from twin.text import TokenStream

__all__ = ["Generation", "QUEUE_FULL_MESSAGE", "admit", "ngram_echo", "request_priority_value", "sampling_values"]


class Generation:
    """An admitted request: engine record, channel, deterministic tokens, timing."""

    __slots__ = (
        "state",
        "rid",
        "req",
        "channel",
        "tokens",
        "created",
        "prompt_tokens",
        "max_new_tokens",
        "t_start",
        "t_first",
        "t_last",
        "finish_reason",
        "prompt_text",
        "lora",
        "cache_root",
        "abort_error",
    )

    def __init__(
        self,
        state: SimState,
        rid: str,
        req: SimRequest | None,
        channel: Channel | None,
        prompt_tokens: int,
        max_new_tokens: int,
        prompt_text: str = "",
        lora: Lease | None = None,
    ) -> None:
        self.state = state
        self.rid = rid
        self.req = req
        self.channel = channel
        self.tokens = TokenStream(req.seed if req is not None else state.rng_seed)
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.prompt_text = prompt_text
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.t_last = 0.0
        self.finish_reason: str | None = None
        self.lora = lora  # the adapter(s) it uses, counted in flight until release()
        self.cache_root = cache_root(lora)
        # set when the scheduler aborted it with status 503 while it ran or waited (priority
        # scheduling: evicted from a full queue, or retracted into one)
        self.abort_error: SchedulerAbort | None = None

    @property
    def completion_tokens(self) -> int:
        return self.req.completion_tokens if self.req is not None else 0

    @property
    def cached_tokens(self) -> int:
        return self.req.cached_tokens if self.req is not None else 0

    @property
    def seed(self) -> int:
        return self.req.seed if self.req is not None else self.state.rng_seed

    async def steps(self) -> AsyncIterator[int]:
        """Token counts, one per engine step that produced tokens for this request.

        `finish_reason` (`length`, `stop` or `abort`) is set before the last step is yielded,
        so a consumer can tell the last step apart; an abort may end the stream without tokens.
        A scheduler abort (503) also sets `abort_error`, which the route answers as SGLang does.
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
                    if self.channel.error is not None:
                        self.abort_error = SchedulerAbort(self.channel.error, self.rid)
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

    def cache_report(self) -> int | None:
        """Cached prompt tokens for `usage.prompt_tokens_details`, None without the flag."""
        return self.cached_tokens if self.state.options.enable_cache_report else None

    def usage(self, reasoning_tokens: int = 0) -> dict[str, Any]:
        """SGLang's `UsageInfo` (field order of protocol.py)."""
        return usage_info(self.prompt_tokens, self.completion_tokens, reasoning_tokens, self.cache_report())

    def spec_details(self) -> dict[str, Any] | None:
        """SGLang 0.5.23 spec fields, or None (AR server, no verify pass)."""
        if self.req is None:
            return None
        d = self.req.spec_details()
        return msgspec.to_builtins(d) if d is not None else None

    def meta_info(self, finished: bool, completion_tokens: int | None = None) -> dict[str, Any]:
        """Native `meta_info`; speculative fields only on the finished output.

        `completion_tokens` overrides the engine's count for chunks streamed mid-way (the
        engine may already be a step ahead of what the client has received).
        """
        c = self.completion_tokens if completion_tokens is None else completion_tokens
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c,
            "cached_tokens": self.cached_tokens,
        }
        if not finished:
            return meta
        reason = self.finish_reason or "length"
        if self.abort_error is not None:  # `scheduler.py: _make_abort_req`
            meta["finish_reason"] = {"type": "abort", "status_code": 503, "message": self.abort_error.message}
        elif reason == "abort":
            meta["finish_reason"] = {"type": "abort", "message": "Abort request"}
        elif reason == "stop":
            meta["finish_reason"] = {"type": "stop", "matched": EOS_TOKEN_ID}
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
            else:  # tokenizer_manager's order
                for key in (
                    "spec_accept_rate",
                    "spec_accept_length",
                    "spec_num_correct_drafts",
                    "spec_num_proposed_drafts",
                    "spec_verify_ct",
                    "spec_correct_drafts_histogram",
                ):
                    meta[key] = spec[key]
        return meta

    def cache_output(self, generated_text: str, separator: str = "") -> None:
        """Put prompt + output in the prefix cache, as SGLang's radix cache does on finish, so
        a follow-up turn whose prompt repeats this text hits (and, on an NGRAM server, the output
        in its trie memory)."""
        if self.req is None or self.finish_reason == "abort" or not self.prompt_text:
            return
        self.state.engine.cache_output(chain_from_text(self.prompt_text + separator + generated_text, self.cache_root))
        self.remember_output(generated_text)

    def remember_output(self, *texts: str) -> None:
        """NGRAM: an answer this server generated (as the client will see it, and its answer
        alone after any reasoning) goes into the server's trie memory (`ngram.py`)."""
        engine = self.state.engine
        if engine.ngram_memory is None or self.req is None or self.finish_reason == "abort":
            return
        for text in texts:
            engine.remember_output(fingerprints(text))

    def release(self) -> None:
        """Free the engine slot if the request is still in flight (client gone, error), and its
        adapters (`tokenizer_manager.py: _release_lora_once`)."""
        self.state.runtime.release(self.rid)
        if self.lora is not None:
            self.state.lora.release(self.lora)


def cache_root(lease: Lease | None) -> int:
    """The radix-cache namespace of a request: its first adapter's id, as SGLang appends the
    adapter's id to the request's `extra_key` (`managers/schedule_batch.py`, `Req.__init__`)."""
    lora_id = next((i for i in lease.ids if i), None) if lease is not None else None
    return namespace_root(lora_id)


def ngram_echo(state: SimState, source: str | None, answer_tokens: int, output_tokens: int) -> float:
    """NGRAM: the share of a request's output that repeats text this server generated, when the
    request asks for `source` back (`ngram.copy_source`); 0.0 on other servers or without one."""
    memory = state.engine.ngram_memory
    if memory is None or not source:
        return 0.0
    return echo_share(memory.recall(fingerprints(source)), answer_tokens, output_tokens)


def request_priority_value(state: SimState, priority: int | None) -> int | None:
    """`tokenizer_manager.py: _set_default_priority`: under priority scheduling a request without
    one gets `--default-priority-value`; any priority must fit a signed 64-bit integer (a
    ValueError of the tokenizer manager: 400, TokenizerError)."""
    opts = state.options.priority
    if priority is None and opts.enable_priority_scheduling:
        priority = opts.default_priority_value
    if priority is not None and not priority_in_range(priority):
        raise TokenizerError(
            "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807"
        )
    return priority


def unbounded_budget(state: SimState, prompt_tokens: int) -> int:
    """The budget of a chat or Responses request that sets no max_tokens. SGLang passes none, and
    its scheduler clamps it to the request length the server allows (`scheduler.py:
    init_req_max_new_tokens`: `max_req_len - input_len - 1`, `tp_worker.py`: `max_req_len` is the
    smaller of context length and KV pool, less 1); the model's EOS ends the answer long before.
    A profile with no answer lengths has no EOS to end it: 128 tokens then (assumption)."""
    profile = state.profile
    if profile.answer is None:
        return CHAT_DEFAULT_MAX_TOKENS
    max_req_len = min(profile.context_length, profile.max_total_num_tokens) - 1
    return max(0, max_req_len - prompt_tokens - 1)


def sampling_values(state: SimState, temperature: float | None, top_p: float | None) -> tuple[float, float]:
    """Resolved temperature/top_p, validated as SGLang's SamplingParams.verify does."""
    t = state.profile.default_temperature if temperature is None else temperature
    p = 1.0 if top_p is None else top_p
    if not math.isfinite(t) or t < 0.0:
        raise ApiError(f"temperature must be a non-negative finite number, got {t}.")
    if not 0.0 < p <= 1.0:
        raise ApiError(f"top_p must be in (0, 1], got {p}.")
    return min(t, 2.0), p


async def admit(
    state: SimState,
    rid: str | None,
    prompt_text: str,
    prompt_tokens: int,
    max_new_tokens: int,
    *,
    domain: str | None = None,
    key: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop_after_tokens: int | None = None,
    prefix_blocks: Sequence[int] | None = None,
    lora: LoraPath = None,
    priority: int | None = None,
    echo: float = 0.0,
) -> Generation:
    """Resolve the priority and the adapter, validate limits, apply fault knobs, submit to the
    engine. Raises ApiError (4xx/5xx); the scheduler's refusals (a full queue, a priority the
    server refuses) are SchedulerAbort (503, SGLang's message).

    The priority's default and range come first (`tokenizer_manager.py: generate_request` calls
    `_set_default_priority` before anything else), then the adapter (`lora`: a name or a list,
    resolved by the route), as SGLang's tokenizer manager resolves it before tokenizing and
    checking the context length; their errors are TokenizerError."""
    priority = request_priority_value(state, priority)
    lease = await state.lora.acquire(lora) if lora else None
    try:
        if max_new_tokens < 0:
            raise ApiError(f"max_new_tokens must be at least 0, got {max_new_tokens}.", param="max_tokens")
        ctx = state.profile.context_length
        if prompt_tokens + max_new_tokens > ctx:
            raise ApiError(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens."
                f" You requested a total of {prompt_tokens + max_new_tokens} tokens:"
                f" {prompt_tokens} tokens from the input messages and {max_new_tokens} tokens for"
                " the completion. Please reduce the number of tokens in the input messages or the"
                " completion to fit within the limit."
            )
        await state.faults.before_generation(prompt_text)
        rid = rid or new_rid()
        if max_new_tokens == 0:
            return Generation(state, rid, None, None, prompt_tokens, 0, prompt_text, lease)
        blocks = chain_from_text(prompt_text, cache_root(lease)) if prefix_blocks is None else prefix_blocks
        try:
            req, ch = state.runtime.submit(
                rid,
                prompt_tokens,
                max_new_tokens,
                prompt_text,
                domain=domain,
                key=key,
                temperature=temperature,
                top_p=top_p,
                stop_after_tokens=stop_after_tokens,
                prefix_blocks=blocks,
                # assumption: a draft trained for the base model accepts less under an adapter
                accept_scale=state.options.lora.acceptance_scale if lease is not None and lease.adapter else 1.0,
                priority=priority,
                echo=echo,
            )
        except RequestAborted as e:  # `_handle_abort_finish_reason`: HTTPException(503) unstreamed
            raise SchedulerAbort(str(e), rid) from None
        except ValueError as e:
            raise ApiError(str(e)) from None
        return Generation(state, rid, req, ch, prompt_tokens, max_new_tokens, prompt_text, lease)
    except BaseException:
        if lease is not None:
            state.lora.release(lease)
        raise
