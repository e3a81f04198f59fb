"""`/v1/chat/completions` and `/v1/completions` with SGLang 0.5.23's shapes, order and timing.

Chat stream (`serving_chat._generate_chat_stream`): role chunk -> per engine step the reasoning
and/or content chunks (or tool-call chunks) of the tokens accepted in that step -> finish chunk ->
`choices: []` chunk with `sglext` (if requested, speculative) -> `choices: []` usage chunk (if
`include_usage`) -> `data: [DONE]`. Completions streams have no role chunk and no separate finish
chunk: the last text chunk carries `finish_reason` (`serving_completions.py`).

As in SGLang, the response (status, headers, first frame) starts only once the first token
exists: the handler awaits the first engine step before preparing the stream, so queueing and
prefill count against a client's time to first byte. A request the scheduler aborts with status
503 (the queue full, a priority the server refuses, eviction by a higher priority; generation.py:
SchedulerAbort) gets, streamed, HTTP 200, `data: {"error": {... "code": 503}}`, the usage chunk if
`include_usage`, and `[DONE]`; not streamed, a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from twin import chunks
from twin.answers import natural_stop
from twin.chat_output import EOS_TOKEN_ID, ChatChunker, OutputScript
from twin.domain import classify, prompt_key
from twin.errors import ApiError, SchedulerAbort, flat_error
from twin.generation import Generation, admit, ngram_echo, sampling_values, unbounded_budget
from twin.lora import resolve_lora_path
from twin.ngram import copy_source
from twin.protocol import (
    COMPLETIONS_ENDPOINT,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    StreamOptions,
    decode_body,
    history_tool_calls,
    message_text,
    request_priority,
)
from twin.state import STATE_KEY, SimState
from twin.text import count_prompt_tokens, render_chat
from twin.thinking import reasoning_tokens
from twin.tools import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    CHAT_ENDPOINT,
    SECTION_BEGIN,
    SECTION_END,
    ToolError,
    fastapi_message,
    plan_call,
    validate_tools,
)

__all__ = ["routes"]

T = TypeVar("T")


def _sglext(state: SimState, gen: Generation, requested: bool) -> dict[str, Any] | None:
    """`sglext` only when asked, on a speculative server, with verify passes, on 0.5.23.

    Older 0.5.x servers (`--compat`) do not know the flag and ignore it.
    """
    if not requested or state.legacy:
        return None
    details = gen.spec_details()
    return {"spec_tokens_details": chunks.spec_tokens_details(details)} if details else None


def _include_usage(options: StreamOptions | None) -> bool:
    return bool(options and options.include_usage)


def _abort_tail(
    state: SimState,
    e: SchedulerAbort,
    chat: bool,
    model: str,
    include_usage: bool,
    created: int,
    usage: dict[str, Any] | None = None,
) -> bytes:
    """How a stream ends once the scheduler aborted its request with a status (`serving_chat.py:
    _generate_chat_stream`, `serving_completions.py`): the error frame with the status's name as
    `type`, and the loop breaks, so no finish chunk; then the usage chunk if `include_usage`, whose
    figures come from the abort's meta_info (`tokenizer_manager.py: _handle_abort_req`), which has
    no prompt or reasoning tokens, only `completion_tokens` (0 unless given, `usage`); `[DONE]`."""
    out = [chunks.stream_error_frame(e.message, "SERVICE_UNAVAILABLE", 503)]
    if include_usage:
        if usage is None:
            usage = chunks.usage_info(0, 0, 0, 0 if state.options.enable_cache_report else None)
        if chat:
            out.append(chunks.chat_tail_chunk(e.rid, created, model, usage=usage))
        else:
            out.append(chunks.completion_usage_chunk(e.rid, created, model, usage))
    out.append(chunks.DONE)
    return b"".join(out)


def _abort_usage(state: SimState, completion_tokens: int) -> dict[str, Any]:
    """The usage of an aborted stream's abort meta_info: its completion tokens only."""
    return chunks.usage_info(0, completion_tokens, 0, 0 if state.options.enable_cache_report else None)


async def _refused(
    request: web.Request,
    state: SimState,
    e: SchedulerAbort,
    *,
    chat: bool,
    stream: bool,
    model: str,
    options: StreamOptions | None,
) -> web.StreamResponse:
    """A request the scheduler aborted as it arrived: the 503, or streamed its abort tail."""
    if not stream:
        return flat_error(e)
    tail = _abort_tail(state, e, chat, model, _include_usage(options), int(time.time()))
    return await _abort_stream(request, tail)


async def _abort_stream(request: web.Request, tail: bytes) -> web.StreamResponse:
    """A streamed request aborted before its first token: HTTP 200 and the abort's tail only (the
    first chunk `_handle_streaming_request` awaits is the error frame)."""
    resp = web.StreamResponse(headers=chunks.SSE_HEADERS)
    await resp.prepare(request)
    await resp.write(tail)
    await resp.write_eof()
    return resp


def _rendered(m: ChatMessage) -> str:
    """A message as the twin's stand-in chat template renders it: assistant tool calls in the
    same Kimi-K2 markup the model emitted, so a follow-up turn repeats the cached text."""
    text = message_text(m)
    for call in m.tool_calls or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            args = args if isinstance(args, str) else ("{}" if args is None else str(args))
            text += f"{SECTION_BEGIN}{CALL_BEGIN}{call.get('id', '')}{ARG_BEGIN}{args}{CALL_END}{SECTION_END}"
    return text


def _thinking(state: SimState, body: ChatRequest) -> bool:
    """Does the model think on this turn? K2.6 thinks unless the template is told not to:
    `chat_template_kwargs.thinking` false, or `reasoning_effort: "none"` (protocol.py sets
    thinking false then). Unknown template kwargs are ignored, as Jinja ignores them."""
    if state.profile.reasoning is None:
        return False
    kwargs = body.chat_template_kwargs or {}
    thinking = kwargs.get("thinking")
    if thinking is None and body.reasoning_effort == "none":
        thinking = False
    return thinking is not False


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    stream = False
    try:
        body: ChatRequest = await decode_body(request, ChatRequest)
        stream = body.stream
        priority = request_priority(body.priority, CHAT_ENDPOINT)
        if not body.messages:
            raise ApiError("Messages cannot be empty.")
        try:
            tools, tool_choice = validate_tools(body.tools, body.tool_choice)
        except ToolError as e:
            raise ApiError(e.message, err_type="Bad Request" if e.schema else None) from None
        _check_samples(body.n)
        if body.return_meta_info and body.stream:
            raise ApiError("return_meta_info is only supported for non-streaming requests", param="return_meta_info")
        temperature, top_p = sampling_values(state, body.temperature, body.top_p)
        turns = [(m.role, _rendered(m)) for m in body.messages]
        # Templates render the tool schemas ahead of the conversation: they count as prompt
        # tokens and stay a stable (cacheable) prefix across turns.
        conversation = render_chat(turns)
        text = (f"tools: {json.dumps(tools, ensure_ascii=False)}\n" if tools else "") + conversation
        domain = classify(conversation)  # what is being written, not the tool schemas
        key = prompt_key(text)
        thinking = _thinking(state, body)
        reasoning = reasoning_tokens(state.profile.reasoning, domain, key) if thinking else 0
        call = (
            plan_call(tools, tool_choice, turns, history_tool_calls(body.messages))
            if tools and tool_choice != "none"
            else None
        )
        # a tool call ends with its call; an answer at EOS (twin.answers)
        stop_after = OutputScript(0, reasoning, call).natural_length or natural_stop(
            state.profile.answer, domain, key, reasoning, body.ignore_eos
        )
        ntok = count_prompt_tokens(text)
        budget = body.requested_max_tokens
        if budget is None:
            budget = unbounded_budget(state, ntok)
        output = min(budget, stop_after) if stop_after is not None else budget
        admit_args: dict[str, Any] = dict(
            domain=domain,
            key=key,
            temperature=temperature,
            top_p=top_p,
            stop_after_tokens=stop_after,
            lora=resolve_lora_path(body.model, state.served_model_name, body.lora_path),
            priority=priority,
            echo=ngram_echo(state, copy_source(turns), output - reasoning, output),
        )
        if body.n > 1:
            gens = await _admit_samples(state, body.n, text, ntok, budget, stream=body.stream, **admit_args)
        else:
            gen = await admit(state, body.rid, text, ntok, budget, **admit_args)
    except SchedulerAbort as e:
        return await _refused(
            request, state, e, chat=True, stream=stream, model=body.model, options=body.stream_options
        )
    except ApiError as e:
        return flat_error(e)
    opts = state.options
    stream_options = body.stream_options

    def chunker_of(g: Generation, index: int = 0) -> ChatChunker:
        return ChatChunker(
            g.rid,
            g.created,
            body.model,
            reasoning_parser=opts.reasoning_parser is not None,
            separate_reasoning=body.separate_reasoning,
            thinking=thinking,
            tool_parsing=opts.tool_call_parser is not None and bool(tools) and tool_choice != "none",
            continuous_usage=bool(stream_options and stream_options.continuous_usage_stats),
            prompt_tokens=g.prompt_tokens,
            cached_tokens=None,
            call=call,
            index=index,
        )

    include_usage = _include_usage(stream_options)
    if body.n > 1:
        samples = [(g, chunker_of(g, i), OutputScript(g.seed, reasoning, call)) for i, g in enumerate(gens)]
        if body.stream:
            return await _chat_samples_stream(request, state, samples, include_usage, body.return_spec_tokens_details)
        return await _chat_samples(state, samples, body.return_spec_tokens_details, body.return_meta_info)
    chunker = chunker_of(gen)
    script = OutputScript(gen.seed, reasoning, call)
    try:
        if body.stream:
            return await _chat_stream(
                request, state, gen, chunker, script, include_usage, body.return_spec_tokens_details
            )
        return await _chat_collect(state, gen, chunker, script, body.return_spec_tokens_details, body.return_meta_info)
    finally:
        # Client gone (handler cancelled) or finished: either way the slot must be freed.
        gen.release()


async def _chat_stream(
    request: web.Request,
    state: SimState,
    gen: Generation,
    chunker: ChatChunker,
    script: OutputScript,
    include_usage: bool,
    want_spec: bool,
) -> web.StreamResponse:
    steps = gen.steps()
    first = await anext(steps, None)  # headers go out with the first token, as in SGLang
    if gen.abort_error is not None:  # aborted while it waited (priority scheduling)
        tail_only = _abort_tail(state, gen.abort_error, True, chunker.model, include_usage, gen.created)
        return await _abort_stream(request, tail_only)
    resp = web.StreamResponse(headers=chunks.SSE_HEADERS)
    await resp.prepare(request)
    try:
        chunker.cached_tokens = gen.cache_report()
        out = chunker.role_chunk()
        if first is not None:
            out += chunker.step(script.take(first))
        await resp.write(out)
        async for n in steps:
            await resp.write(chunker.step(script.take(n)))
        if gen.abort_error is not None:  # retracted by priority into a full queue
            usage = _abort_usage(state, gen.completion_tokens)
            tail_bytes = _abort_tail(state, gen.abort_error, True, chunker.model, include_usage, gen.created, usage)
            await resp.write(tail_bytes)
            await resp.write_eof()
            return resp
        tail = [chunker.finish_chunk(gen.finish_reason)]
        sglext = _sglext(state, gen, want_spec)
        if sglext is not None:
            tail.append(chunks.chat_tail_chunk(gen.rid, gen.created, chunker.model, sglext=sglext))
        if include_usage:
            tail.append(chunks.chat_tail_chunk(gen.rid, gen.created, chunker.model, usage=chunker.usage()))
        await resp.write(b"".join(tail) + chunks.DONE)
        await resp.write_eof()
        _cache_answer(gen, script)
    except ConnectionResetError:
        state.runtime.abort(gen.rid)
    return resp


async def _chat_collect(
    state: SimState, gen: Generation, chunker: ChatChunker, script: OutputScript, want_spec: bool, want_meta: bool
) -> web.Response:
    await _decode_chat(gen, chunker, script)
    if gen.abort_error is not None:  # `_handle_abort_finish_reason`: HTTPException(503)
        return flat_error(gen.abort_error)
    chunker.cached_tokens = gen.cache_report()
    meta = gen.meta_info(finished=True) if want_meta else None
    body = chunker.response(gen.finish_reason, meta, _sglext(state, gen, want_spec))
    _cache_answer(gen, script)
    return web.Response(body=body, content_type="application/json")


# ----------------------------------------------------------------------- completions


def _completion_prompt(prompt: str | list[Any]) -> tuple[str, int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError("Prompt cannot be empty")
        return prompt, count_prompt_tokens(prompt)
    if not prompt or all(not p for p in prompt):
        raise ApiError("Prompt cannot be empty")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return " ".join(map(str, prompt)), len(prompt)
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], count_prompt_tokens(prompt[0])
    raise ApiError("the twin serves one prompt per request (a string or a list of token ids)", param="prompt")


def _max_tokens_error(value: int) -> ApiError:
    """CompletionRequest's `validate_max_tokens_positive`, reported by FastAPI's handler."""
    err = {
        "type": "value_error",
        "loc": ("body", "max_tokens"),
        "msg": "Value error, max_tokens must be positive",
        "input": value,
        "ctx": {"error": "max_tokens must be positive"},
    }
    return ApiError(fastapi_message([err], COMPLETIONS_ENDPOINT), err_type="Bad Request")


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    stream = False
    try:
        body: CompletionRequest = await decode_body(request, CompletionRequest)
        stream = body.stream
        priority = request_priority(body.priority, COMPLETIONS_ENDPOINT)
        if body.max_tokens is not None and body.max_tokens <= 0:
            raise _max_tokens_error(body.max_tokens)
        _check_samples(body.n)
        text, ntok = _completion_prompt(body.prompt)
        temperature, top_p = sampling_values(state, body.temperature, body.top_p)
        lora = resolve_lora_path(body.model, state.served_model_name, body.lora_path)
        domain, key = classify(text), prompt_key(text)
        sampling: dict[str, Any] = dict(
            domain=domain,
            key=key,
            temperature=temperature,
            top_p=top_p,
            stop_after_tokens=natural_stop(state.profile.answer, domain, key, ignore_eos=body.ignore_eos),
            lora=lora,
            priority=priority,
        )
        if body.n > 1:
            gens = await _admit_samples(
                state, body.n, text, ntok, body.requested_max_tokens, stream=body.stream, **sampling
            )
            if body.stream:
                return await _completion_samples_stream(request, state, body, gens)
            return await _completion_samples(state, body, gens)
        gen = await admit(state, body.rid, text, ntok, body.requested_max_tokens, **sampling)
    except SchedulerAbort as e:
        return await _refused(
            request, state, e, chat=False, stream=stream, model=body.model, options=body.stream_options
        )
    except ApiError as e:
        return flat_error(e)
    stream_options = body.stream_options
    include_usage = _include_usage(stream_options)
    continuous = bool(stream_options and stream_options.continuous_usage_stats)
    try:
        if body.stream:
            return await _completion_stream(
                request, state, gen, body.model, include_usage, continuous, body.return_spec_tokens_details
            )
        out = await _collect_text(gen)
        if gen.abort_error is not None:  # `_handle_abort_finish_reason`: HTTPException(503)
            return flat_error(gen.abort_error)
        reason, matched = _completion_reason(gen)
        resp_body = chunks.completion_response(
            gen.rid,
            gen.created,
            body.model,
            out,
            reason,
            matched,
            gen.usage(),
            _sglext(state, gen, body.return_spec_tokens_details),
        )
        gen.cache_output(out)
        return web.Response(body=resp_body, content_type="application/json")
    finally:
        gen.release()


# Assumption, not SGLang's behaviour: SGLang admits any `n` and would try to hold them all. The
# twin refuses more so that one request cannot take its host's memory (the gateway allows 128).
MAX_SAMPLES = 1024


def _check_samples(n: int) -> None:
    if n < 1:
        raise ApiError("n must be at least 1", param="n")
    if n > MAX_SAMPLES:
        raise ApiError(f"n must be at most {MAX_SAMPLES} (a limit of the twin, not of SGLang)", param="n")


async def _admit_samples(
    state: SimState, n: int, text: str, ntok: int, max_new_tokens: int, *, stream: bool, **admit_args: Any
) -> list[Generation]:
    """`n` > 1, as SGLang's tokenizer manager runs parallel sampling: the prompt is prefilled once
    alone first, so the samples find it cached (assumption: that warm-up decodes one token, where
    SGLang's asks for none); then every sample runs under a fresh rid (`regenerate_rid`: a
    client's `rid` is not kept). A scheduler abort of the warm-up once it is queued (priority
    eviction) fails a non-streamed request (its HTTPException) and is passed over when streamed:
    `_handle_batch_request` reads the warm-up's first output and carries on whatever it was."""
    warm_up = await admit(state, None, text, ntok, 1, **{**admit_args, "stop_after_tokens": None})
    try:
        await _collect_text(warm_up)
    finally:
        warm_up.release()
    if warm_up.abort_error is not None and not stream:
        raise warm_up.abort_error
    gens: list[Generation] = []
    try:
        for _ in range(n):
            gens.append(await admit(state, None, text, ntok, max_new_tokens, **admit_args))
    except BaseException:
        for gen in gens:
            gen.release()
        raise
    return gens


async def _unless_aborted(gen: Generation, work: Awaitable[T]) -> T:
    """`work` over a sample, then its scheduler abort raised if it had one."""
    out = await work
    if gen.abort_error is not None:
        raise gen.abort_error
    return out


async def _gather_samples(works: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every sample's result, as `tokenizer_manager.py: _collect_batch_responses` gathers them: the
    first error (a sample's HTTPException(503)) ends the wait and the other waits are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def _samples_usage(gens: list[Generation]) -> dict[str, Any]:
    """The prompt counted once, the completions summed (`usage_processor.py`)."""
    first = gens[0]
    return chunks.usage_info(first.prompt_tokens, sum(g.completion_tokens for g in gens), 0, first.cache_report())


def _abort_frame(gen: Generation) -> bytes:
    """The error frame of a sample the scheduler aborted (`create_streaming_error_response`)."""
    assert gen.abort_error is not None
    return chunks.stream_error_frame(gen.abort_error.message, "SERVICE_UNAVAILABLE", 503)


def _aborted_samples_usage(gens: list[Generation], reasoning: list[int], aborted: int) -> dict[str, Any]:
    """`n` > 1 after one sample's abort, as `UsageProcessor.calculate_streaming_usage` sums the last
    output of each sample: the aborted one's is its abort meta_info, which carries its completion
    tokens but no prompt, cached or reasoning tokens (the prompt is counted from sample 0)."""
    first = gens[0]
    cached = first.cache_report()
    return chunks.usage_info(
        0 if aborted == 0 else first.prompt_tokens,
        sum(g.completion_tokens for g in gens),
        sum(r for i, r in enumerate(reasoning) if i != aborted),
        0 if aborted == 0 and cached is not None else cached,
    )


def _samples_sglext(state: SimState, gens: list[Generation], requested: bool) -> dict[str, Any] | None:
    """`spec_tokens_details` as a list, one entry per sample."""
    details = [x["spec_tokens_details"] for g in gens if (x := _sglext(state, g, requested)) is not None]
    return {"spec_tokens_details": details} if details else None


async def _completion_samples(state: SimState, body: CompletionRequest, gens: list[Generation]) -> web.Response:
    """`n` > 1, not streamed: one choice per sample; the response's id is the first's."""
    try:
        try:
            outs = await _gather_samples([_unless_aborted(g, _collect_text(g)) for g in gens])
        except SchedulerAbort as e:  # a sample's HTTPException(503) answers the request at once
            return flat_error(e)
        choices = []
        for i, (gen, out) in enumerate(zip(gens, outs, strict=True)):
            reason, matched = _completion_reason(gen)
            choices.append(chunks.completion_choice(i, out, reason, matched))
            gen.cache_output(out)
        first = gens[0]
        resp_body = chunks.response(
            first.rid,
            "text_completion",
            first.created,
            body.model,
            choices,
            _samples_usage(gens),
            _samples_sglext(state, gens, body.return_spec_tokens_details),
        )
        return web.Response(body=resp_body, content_type="application/json")
    finally:
        for gen in gens:
            gen.release()


async def _completion_samples_stream(
    request: web.Request, state: SimState, body: CompletionRequest, gens: list[Generation]
) -> web.StreamResponse:
    """`n` > 1, streamed: the samples' chunks interleaved as they are generated, each with its
    choice index and its own rid as the chunk id (`serving_completions.py`); then `sglext` and the
    usage under the id of the last chunk's sample."""
    stream_options = body.stream_options
    include_usage = bool(stream_options and stream_options.include_usage)
    continuous = bool(stream_options and stream_options.continuous_usage_stats)
    done = [0] * len(gens)
    parts: list[list[str]] = [[] for _ in gens]
    finished = [False] * len(gens)
    last = gens[0]

    def chunk(i: int, n: int) -> bytes:
        nonlocal last
        gen = last = gens[i]
        done[i] += n
        text = gen.tokens.take(n)
        parts[i].append(text)
        finished[i] = gen.finish_reason is not None
        reason, matched = _completion_reason(gen) if finished[i] else (None, None)
        usage = chunks.usage_info(gen.prompt_tokens, done[i]) if continuous else None
        return chunks.completion_chunk(gen.rid, gen.created, body.model, text, reason, matched, usage, index=i)

    stream = _HeadersWithFirstToken(request)
    events = _interleaved(gens)
    async with _owning(state, gens, events):
        aborted: int | None = None
        async for i, n in events:
            if n is None:
                if gens[i].abort_error is not None:  # the scheduler aborted this sample
                    aborted = i
                    break
                if finished[i]:
                    continue
                n = 0  # ended without tokens in its last step (an abort)
            await stream.write(chunk(i, n))
        tail: list[bytes] = []
        if aborted is not None:
            tail.append(_abort_frame(gens[aborted]))
            last = gens[aborted]
        sglext = _samples_sglext(state, gens, body.return_spec_tokens_details)
        if sglext is not None:
            tail.append(chunks.completion_tail_chunk(last.rid, last.created, body.model, sglext))
        if include_usage:
            usage = _samples_usage(gens) if aborted is None else _aborted_samples_usage(gens, [0] * len(gens), aborted)
            tail.append(chunks.completion_usage_chunk(last.rid, last.created, body.model, usage))
        await stream.end(b"".join(tail) + chunks.DONE)
        for gen, text in zip(gens, parts, strict=True):
            gen.cache_output("".join(text))
    return stream.response


class _HeadersWithFirstToken:
    """A stream whose status and headers go out with its first chunk, as SGLang sends them with
    the first token (`serving_chat._handle_streaming_request`)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(headers=chunks.SSE_HEADERS)

    async def write(self, data: bytes) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        await self.response.write(data)

    async def end(self, data: bytes) -> None:
        await self.write(data)
        await self.response.write_eof()


@contextlib.asynccontextmanager
async def _owning(
    state: SimState, gens: list[Generation], events: AsyncGenerator[tuple[int, int | None], None]
) -> AsyncIterator[None]:
    """A streamed `n` > 1 answer owns its samples: a client gone aborts them all, and every way out
    stops their pumps and frees their slots."""
    try:
        yield
    except ConnectionResetError:
        for gen in gens:
            state.runtime.abort(gen.rid)
    finally:
        await events.aclose()
        for gen in gens:
            gen.release()


async def _interleaved(gens: list[Generation]) -> AsyncGenerator[tuple[int, int | None], None]:
    """(sample, tokens of its step) as the samples' engine steps come, and (sample, None) once
    each sample has ended."""
    queue: asyncio.Queue[tuple[int, int | None]] = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for n in gen.steps():
                queue.put_nowait((i, n))
        finally:  # ended, failed or cancelled: the reader never waits for it in vain
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        ended = 0
        while ended < len(gens):
            item = await queue.get()
            ended += item[1] is None
            yield item
    finally:
        for task in tasks:
            task.cancel()


Sample = tuple[Generation, ChatChunker, OutputScript]


def _chat_samples_usage(samples: list[Sample]) -> dict[str, Any]:
    """The prompt counted once, completions and reasoning summed (`usage_processor.py`)."""
    first_gen, first, _ = samples[0]
    return chunks.usage_info(
        first.prompt_tokens,
        sum(c.completion_tokens for _, c, _ in samples),
        sum(c.reasoning_tokens for _, c, _ in samples),
        first_gen.cache_report(),
    )


async def _chat_samples(state: SimState, samples: list[Sample], want_spec: bool, want_meta: bool) -> web.Response:
    """Chat with `n` > 1, not streamed: one choice per sample; the response's id is the first's."""
    gens = [g for g, _, _ in samples]
    try:
        try:
            await _gather_samples([_unless_aborted(s[0], _decode_chat(*s)) for s in samples])
        except SchedulerAbort as e:  # a sample's HTTPException(503) answers the request at once
            return flat_error(e)
        choices = []
        for gen, chunker, script in samples:
            chunker.cached_tokens = gen.cache_report()
            choices.append(chunker.choice(gen.finish_reason, gen.meta_info(finished=True) if want_meta else None))
            _cache_answer(gen, script)
        first = gens[0]
        body = chunks.response(
            first.rid,
            "chat.completion",
            first.created,
            samples[0][1].model,
            choices,
            _chat_samples_usage(samples),
            _samples_sglext(state, gens, want_spec),
        )
        return web.Response(body=body, content_type="application/json")
    finally:
        for gen in gens:
            gen.release()


async def _chat_samples_stream(
    request: web.Request, state: SimState, samples: list[Sample], include_usage: bool, want_spec: bool
) -> web.StreamResponse:
    """Chat with `n` > 1, streamed, as `serving_chat.py` writes it: each sample's chunks under its
    own id, a role chunk before its first; once all have ended, the finish chunks in the order the
    samples finished, under the id of the last chunk's sample, then `sglext` and usage."""
    gens = [g for g, _, _ in samples]
    stream = _HeadersWithFirstToken(request)
    events = _interleaved(gens)
    started = [False] * len(samples)
    finish_order: list[int] = []
    last = gens[0]
    async with _owning(state, gens, events):
        aborted: int | None = None
        async for i, n in events:
            gen, chunker, script = samples[i]
            if n is None:
                if gen.abort_error is not None:  # the scheduler aborted this sample: the loop breaks
                    aborted = i
                    break
                finish_order.append(i)
                continue
            last = gen
            out = b""
            if not started[i]:
                started[i] = True
                chunker.cached_tokens = gen.cache_report()
                out = chunker.role_chunk()
            out += chunker.step(script.take(n))
            await stream.write(out)
        tail: list[bytes] = []
        if aborted is not None:
            tail.append(_abort_frame(gens[aborted]))
            last = gens[aborted]
        # the samples that finished before (all, without an abort)
        tail += [samples[i][1].finish_chunk(gens[i].finish_reason, rid=last.rid) for i in finish_order]
        model = samples[0][1].model
        sglext = _samples_sglext(state, gens, want_spec)
        if sglext is not None:
            tail.append(chunks.chat_tail_chunk(last.rid, last.created, model, sglext=sglext))
        if include_usage:
            if aborted is None:
                usage = _chat_samples_usage(samples)
            else:
                usage = _aborted_samples_usage(gens, [c.reasoning_tokens for _, c, _ in samples], aborted)
            tail.append(chunks.chat_tail_chunk(last.rid, last.created, model, usage=usage))
        await stream.end(b"".join(tail) + chunks.DONE)
        for gen, _, script in samples:
            _cache_answer(gen, script)
    return stream.response


async def _decode_chat(gen: Generation, chunker: ChatChunker, script: OutputScript) -> None:
    """Every step of a non-streamed chat answer through its chunker (which assembles the body)."""
    async for n in gen.steps():
        chunker.step(script.take(n))


def _cache_answer(gen: Generation, script: OutputScript) -> None:
    """The finished chat turn into the prefix cache, as the stand-in template renders it, so the
    next turn, which repeats it, hits; on an NGRAM server into its trie memory too (the whole
    turn, and the answer after any reasoning: what a client sends back with or without a
    reasoning parser)."""
    generated = "".join(script.text_parts)
    gen.cache_output(generated + "\n", "assistant: ")
    if script.reasoning_tokens:
        gen.remember_output("".join(script.text_parts[script.reasoning_tokens :]))


async def _collect_text(gen: Generation) -> str:
    return "".join([gen.tokens.take(n) async for n in gen.steps()])


def _completion_reason(gen: Generation) -> tuple[str | None, int | None]:
    if gen.finish_reason == "stop":
        return "stop", EOS_TOKEN_ID
    return gen.finish_reason, None


async def _completion_stream(
    request: web.Request,
    state: SimState,
    gen: Generation,
    model: str,
    include_usage: bool,
    continuous: bool,
    want_spec: bool,
) -> web.StreamResponse:
    steps = gen.steps()
    first = await anext(steps, None)
    if gen.abort_error is not None:  # aborted while it waited (priority scheduling)
        tail_only = _abort_tail(state, gen.abort_error, False, model, include_usage, gen.created)
        return await _abort_stream(request, tail_only)
    resp = web.StreamResponse(headers=chunks.SSE_HEADERS)
    await resp.prepare(request)
    done = 0
    parts: list[str] = []
    finish_sent = False

    def chunk(n: int) -> bytes:
        nonlocal done, finish_sent
        done += n
        text = gen.tokens.take(n)
        parts.append(text)
        last = gen.finish_reason is not None
        finish_sent = last
        reason, matched = _completion_reason(gen) if last else (None, None)
        usage = chunks.usage_info(gen.prompt_tokens, done) if continuous else None
        return chunks.completion_chunk(gen.rid, gen.created, model, text, reason, matched, usage)

    try:
        if first is not None:
            await resp.write(chunk(first))
        async for n in steps:
            await resp.write(chunk(n))
        if gen.abort_error is not None:  # retracted by priority into a full queue
            usage = _abort_usage(state, gen.completion_tokens)
            await resp.write(_abort_tail(state, gen.abort_error, False, model, include_usage, gen.created, usage))
            await resp.write_eof()
            return resp
        tail: list[bytes] = []
        if not finish_sent:
            tail.append(chunk(0))  # ended without tokens in its last step (an abort)
        sglext = _sglext(state, gen, want_spec)
        if sglext is not None:
            tail.append(chunks.completion_tail_chunk(gen.rid, gen.created, model, sglext))
        if include_usage:
            tail.append(chunks.completion_usage_chunk(gen.rid, gen.created, model, gen.usage()))
        await resp.write(b"".join(tail) + chunks.DONE)
        await resp.write_eof()
        gen.cache_output("".join(parts))
    except ConnectionResetError:
        state.runtime.abort(gen.rid)
    return resp


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/chat/completions", chat_completions), web.post("/v1/completions", completions)]
