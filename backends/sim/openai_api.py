"""`/v1/chat/completions` and `/v1/completions` with SGLang's shapes and chunk order.

Stream order (SGLANG_API.md item 5): role chunk (chat only) -> one content chunk per engine step
(all tokens accepted in that step) -> finish_reason chunk -> `choices: []` chunk with `sglext`
when spec details were requested on a speculative server -> `choices: []` usage chunk when
`stream_options.include_usage` -> `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from backends.sim.errors import ApiError, flat_error
from backends.sim.generation import Generation, admit
from backends.sim.protocol import ChatRequest, CompletionRequest, decode_body, message_text
from backends.sim.state import STATE_KEY, SimState
from backends.sim.text import count_prompt_tokens, render_chat

__all__ = ["routes"]

_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]\n\n"


def _frame(obj: Any) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


class _Format:
    """Chunk and response shapes of one OpenAI route."""

    chunk_object = ""
    object = ""

    def __init__(self, gen: Generation, model: str) -> None:
        self.id = gen.rid
        self.created = gen.created
        self.model = model

    def _chunk(self, choices: list, **extra: Any) -> dict:
        out = {"id": self.id, "object": self.chunk_object, "created": self.created,
               "model": self.model, "choices": choices}
        out.update(extra)
        return out

    def tail(self, reason: str | None, usage: dict, sglext: dict | None,
             include_usage: bool) -> list[dict]:
        """Chunks after the last content chunk, in SGLang's order."""
        out = [self.finish_chunk(reason)]
        if sglext is not None:
            out.append(self._chunk([], usage=None, sglext=sglext))
        if include_usage:
            out.append(self._chunk([], usage=usage))
        return out

    def finish_chunk(self, reason: str | None) -> dict:
        raise NotImplementedError

    def content_chunk(self, text: str) -> dict:
        raise NotImplementedError

    def response(self, text: str, reason: str | None, usage: dict) -> dict:
        raise NotImplementedError


class _ChatFormat(_Format):
    chunk_object = "chat.completion.chunk"
    object = "chat.completion"

    @staticmethod
    def _delta(role: str | None, content: str | None) -> dict:
        return {"role": role, "content": content, "reasoning_content": None, "tool_calls": None}

    def role_chunk(self) -> dict:
        return self._chunk([{"index": 0, "delta": self._delta("assistant", ""), "logprobs": None,
                             "finish_reason": None, "matched_stop": None}], usage=None)

    def content_chunk(self, text: str) -> dict:
        return self._chunk([{"index": 0, "delta": self._delta(None, text), "logprobs": None,
                             "finish_reason": None, "matched_stop": None}], usage=None)

    def finish_chunk(self, reason: str | None) -> dict:
        return self._chunk([{"index": 0, "delta": self._delta(None, None), "logprobs": None,
                             "finish_reason": reason, "matched_stop": None}], usage=None)

    def response(self, text: str, reason: str | None, usage: dict) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model,
                "choices": [{"index": 0,
                             "message": {"role": "assistant", "content": text,
                                         "reasoning_content": None, "tool_calls": None},
                             "logprobs": None, "finish_reason": reason, "matched_stop": None}],
                "usage": usage}


class _CompletionFormat(_Format):
    chunk_object = "text_completion"
    object = "text_completion"

    def content_chunk(self, text: str) -> dict:
        return self._chunk([{"index": 0, "text": text, "logprobs": None, "finish_reason": None,
                             "matched_stop": None}], usage=None)

    def finish_chunk(self, reason: str | None) -> dict:
        return self._chunk([{"index": 0, "text": "", "logprobs": None, "finish_reason": reason,
                             "matched_stop": None}], usage=None)

    def response(self, text: str, reason: str | None, usage: dict) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": reason, "matched_stop": None}],
                "usage": usage}


def _sglext(state: SimState, gen: Generation, requested: bool) -> dict | None:
    """`sglext` only when asked, on a speculative server, with verify passes, on 0.5.23.

    Older 0.5.x servers (`--compat`) do not know the flag and ignore it.
    """
    if not requested or state.legacy:
        return None
    details = gen.spec_details()
    return {"spec_tokens_details": details} if details is not None else None


async def _stream(request: web.Request, state: SimState, gen: Generation, fmt: _Format,
                  include_usage: bool, want_spec: bool) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    try:
        if isinstance(fmt, _ChatFormat):
            await resp.write(_frame(fmt.role_chunk()))
        async for n in gen.steps():
            await resp.write(_frame(fmt.content_chunk(gen.tokens.take(n))))
        tail = fmt.tail(gen.finish_reason, gen.usage(), _sglext(state, gen, want_spec),
                        include_usage)
        await resp.write(b"".join(_frame(c) for c in tail) + _DONE)
        await resp.write_eof()
    except ConnectionResetError:
        state.runtime.abort(gen.rid)
    return resp


async def _collect(state: SimState, gen: Generation, fmt: _Format, want_spec: bool,
                   want_meta: bool) -> web.Response:
    parts = [gen.tokens.take(n) async for n in gen.steps()]
    body = fmt.response("".join(parts), gen.finish_reason, gen.usage())
    if want_meta:
        body["choices"][0]["meta_info"] = gen.meta_info(finished=True)
    sglext = _sglext(state, gen, want_spec)
    if sglext is not None:
        body["sglext"] = sglext
    return web.Response(body=_encode(body), content_type="application/json")


async def _serve(request: web.Request, state: SimState, gen: Generation, fmt: _Format,
                 stream: bool, include_usage: bool, want_spec: bool,
                 want_meta: bool = False) -> web.StreamResponse:
    try:
        if stream:
            return await _stream(request, state, gen, fmt, include_usage, want_spec)
        return await _collect(state, gen, fmt, want_spec, want_meta)
    finally:
        # Client gone (handler cancelled) or finished: either way the slot must be freed.
        gen.release()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:
        body: ChatRequest = await decode_body(request, ChatRequest)
        if not body.messages:
            raise ApiError("messages must contain at least one message", param="messages")
        if body.n != 1:
            raise ApiError("the twin serves n=1 only", param="n")
        if body.return_meta_info and body.stream:
            raise ApiError("return_meta_info is only supported for non-streaming requests",
                           param="return_meta_info")
        text = render_chat([(m.role, message_text(m)) for m in body.messages])
        gen = await admit(state, body.rid, text, count_prompt_tokens(text),
                          body.requested_max_tokens)
    except ApiError as e:
        return flat_error(e)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await _serve(request, state, gen, _ChatFormat(gen, body.model), body.stream,
                        include_usage, body.return_spec_tokens_details, body.return_meta_info)


def _completion_prompt(prompt: str | list[Any]) -> tuple[str, int]:
    if isinstance(prompt, str):
        return prompt, count_prompt_tokens(prompt)
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return " ".join(map(str, prompt)), len(prompt)
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], count_prompt_tokens(prompt[0])
    raise ApiError("the twin serves one prompt per request (a string or a list of token ids)",
                   param="prompt")


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:
        body: CompletionRequest = await decode_body(request, CompletionRequest)
        if body.n != 1:
            raise ApiError("the twin serves n=1 only", param="n")
        text, ntok = _completion_prompt(body.prompt)
        gen = await admit(state, body.rid, text, ntok, body.requested_max_tokens)
    except ApiError as e:
        return flat_error(e)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await _serve(request, state, gen, _CompletionFormat(gen, body.model), body.stream,
                        include_usage, body.return_spec_tokens_details)


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/chat/completions", chat_completions),
            web.post("/v1/completions", completions)]
