"""`/v1/responses` (OpenAI Responses API) as SGLang 0.5.23 serves it for a non-harmony model, the
common subset: text input and message items, `instructions`, `max_output_tokens`, temperature and
top_p, the reasoning split, streaming, and with `--enable-response-store` the store,
`previous_response_id`, `GET /v1/responses/{id}`, `background` and cancel
(`entrypoints/openai/serving_responses.py`, `http_server.py`).

For the engine a Responses request is a chat request (`serving_responses._make_request` builds a
`ChatCompletionRequest`): the same stand-in chat template, domain, reasoning length, `admit`,
prefix cache and step loop as `/v1/chat/completions`, so timing is the chat route's. What differs
is the wire: one response object (responses_output.py), or typed SSE events whose first two
(`response.created`, `response.in_progress`) go out before the engine is even asked (the route
returns a `StreamingResponse` over a generator that starts generation after yielding them), and no
`data: [DONE]`. Errors are nested `{"error": {...}}` (errors.responses_error); an error raised by
generation (context length, a full queue) is a 400 when not streamed and a `response.failed`
event when streamed. The request's `priority` is checked (`int`) but not used: SGLang hands it to
`_generate_with_builtin_tools`, which never puts it on the `GenerateReqInput` it sends, so a
Responses request is scheduled with the server's default priority.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from aiohttp import web
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

from twin.answers import natural_stop
from twin.chat_output import OutputScript
from twin.chunks import SSE_HEADERS
from twin.domain import classify, prompt_key
from twin.errors import ApiError, SchedulerAbort, responses_error
from twin.generation import Generation, admit, sampling_values, unbounded_budget
from twin.lora import parse_model_parameter
from twin.protocol import ResponsesRequest, decode_body, request_priority
from twin.responses_output import (
    ECHOABLE_REASONING_EFFORTS,
    ResponseEvents,
    drop_none,
    message_item,
    reasoning_item,
    response_error,
    response_object,
    responses_usage,
    status_from_finish,
)
from twin.state import STATE_KEY, SimState
from twin.text import count_prompt_tokens, render_chat
from twin.thinking import reasoning_tokens
from twin.tools import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END, fastapi_message

__all__ = ["routes"]

_INVALID = "invalid_request_error"
# FastAPI's RequestValidationError names the route's function (`http_server.py`)
_ENDPOINT = '  File "sglang/srt/entrypoints/http_server.py", line 2066, in v1_responses_request\n    POST /v1/responses'


# ------------------------------------------------------------------------------ tools (echo)


class ResponseTool(BaseModel):
    """`protocol.py: ResponseTool` (extra fields allowed and echoed). Tools are validated and
    echoed; the twin never calls one from `/v1/responses` (not modelled)."""

    model_config = ConfigDict(extra="allow")

    type: Literal[
        "function",
        "web_search",
        "web_search_preview",
        "code_interpreter",
        "file_search",
        "image_generation",
        "computer_use_preview",
        "local_shell",
        "shell",
        "mcp",
        "custom",
        "namespace",
        "tool_search",
    ]
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False
    tools: list[dict[str, Any]] | None = None
    defer_loading: bool | None = None
    format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def validate_function_tool(self) -> ResponseTool:
        if self.type == "function" and not self.name:
            raise ValueError("Function tools must include a name.")
        return self


_TOOLS = TypeAdapter(list[ResponseTool])


def _tools(raw: list[dict[str, Any]]) -> list[ResponseTool]:
    """The request-schema check of `tools`: a 400 in FastAPI's words (`http_server.py`)."""
    try:
        return _TOOLS.validate_python(raw)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", "tools", *err["loc"])} for err in e.errors(include_url=False)]
        raise ApiError(fastapi_message(errors, _ENDPOINT), err_type="Bad Request") from None


def _effective_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """`ResponsesRequest.effective_tool_choice`: of the object forms only a named function or
    custom tool survives, the rest is "auto"."""
    if not isinstance(choice, dict):
        return choice
    fn = choice.get("function")
    name = choice.get("name") or (fn.get("name") if isinstance(fn, dict) else None)
    if choice.get("type") in ("function", "custom") and name:
        out: dict[str, Any] = {"type": choice["type"], "name": name}
        if "namespace" in choice:
            out["namespace"] = choice["namespace"]
        return out
    return "auto"


# ---------------------------------------------------------------------------- conversation


def _part_for_chat(part: Any) -> Any:
    """`_normalize_response_content_part_for_chat`, text parts (images keep no text)."""
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    return part


def _chat_message(item: Any) -> dict[str, Any] | None:
    """`_normalize_response_message_for_chat`: one input item as a chat message (None: dropped)."""
    if not isinstance(item, dict):
        return None
    if item.get("role") == "developer":  # SGLang also labels the content (not modelled)
        item = {**item, "role": "system"}
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        args = item.get("arguments") if kind == "function_call" else item.get("input")
        call = {"id": item.get("call_id") or item.get("id"), "name": item.get("name"), "arguments": args or "{}"}
        return {"role": "assistant", "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output", "")
        if isinstance(output, list):
            output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
    if kind == "reasoning":
        texts = [
            e["text"]
            for e in (item.get("summary") or item.get("content") or [])
            if isinstance(e, dict) and e.get("text")
        ]
        return {"role": "assistant", "reasoning_content": "\n".join(texts)} if texts else None
    if kind not in (None, "message"):
        # raised as a ValueError and answered `f"{e} {e.__cause__}"` (`create_responses`)
        raise ApiError(f"Unsupported Responses API input item type: {kind!r} None", err_type=_INVALID)
    content = item.get("content")
    if isinstance(content, list):
        item = {**item, "content": [_part_for_chat(p) for p in content]}
    return {k: v for k, v in item.items() if v is not None and k not in ("id", "status", "type")}


def _merge_assistants(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`_merge_consecutive_assistant_messages`: a reasoning item and the message after it (or two
    messages of one phase) become one assistant turn."""
    merged: list[dict[str, Any]] = []
    for msg in messages:
        prev = merged[-1] if merged else None
        if (
            msg.get("role") == "assistant"
            and prev is not None
            and prev.get("role") == "assistant"
            and (prev.get("phase") == msg.get("phase") or set(prev) == {"role", "reasoning_content"})
        ):
            prev = merged[-1] = dict(prev)
            if msg.get("phase") is not None:
                prev["phase"] = msg["phase"]
            new = msg.get("content")
            if new:
                old = prev.get("content")
                if not old:
                    prev["content"] = new
                elif isinstance(old, str) and isinstance(new, str):
                    prev["content"] = old + "\n\n" + new
                else:
                    prev["content"] = _as_parts(old) + _as_parts(new)
            if msg.get("tool_calls"):
                prev["tool_calls"] = (prev.get("tool_calls") or []) + list(msg["tool_calls"])
            if msg.get("reasoning_content"):
                r = prev.get("reasoning_content")
                prev["reasoning_content"] = f"{r}\n{msg['reasoning_content']}" if r else msg["reasoning_content"]
            continue
        merged.append(msg)
    return merged


def _as_parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _text_of(content: Any) -> str:
    """A message's text as the chat route reads it (`protocol.message_text`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _rendered(msg: dict[str, Any]) -> str:
    """The stand-in template's text of a message, as the chat route renders it: content, and an
    assistant's tool calls in Kimi-K2 markup; reasoning is not rendered."""
    text = _text_of(msg.get("content"))
    for call in msg.get("tool_calls") or []:
        text += f"{SECTION_BEGIN}{CALL_BEGIN}{call['id'] or ''}{ARG_BEGIN}{call['arguments']}{CALL_END}{SECTION_END}"
    return text


def _messages(instructions: str | None, history: list[Any]) -> list[dict[str, Any]]:
    """`_construct_input_messages`: `instructions` as a system message, the history's items, the
    assistant runs merged, the system messages coalesced in front (joined by a blank line).
    Assumption: the model's template is not one SGLang detects as taking inline system messages."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    messages += [m for m in map(_chat_message, history) if m is not None]
    messages = _merge_assistants(messages)
    system = [_text_of(m.get("content")) for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + rest


# ------------------------------------------------------------------------------------ plan


@dataclass
class _Plan:
    """Everything decided before generation."""

    body: ResponsesRequest
    rid: str
    created: int
    echo: dict[str, Any]
    history: list[Any]  # the conversation's input items (`_response_input_history`)
    persist: bool  # --enable-response-store and `store`
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    domain: str
    key: int
    thinking: bool
    reasoning: int  # reasoning tokens of the turn (0: no reasoning)
    split: bool  # the reasoning parser separates reasoning from the answer
    hold_message: bool  # callable tools: message events held to the end (streaming)


def _store_disabled(param: str) -> ApiError:
    """`serving_responses._response_store_disabled_error`."""
    return ApiError(
        "Response store is disabled. Stateful Responses require --enable-response-store on a standalone"
        " server; response storage is unavailable in PD mode.",
        param=param,
        err_type=_INVALID,
    )


def _invalid_id(rid: str) -> ApiError:
    """`serving_responses._make_invalid_id_error`."""
    return ApiError(
        f"Invalid 'response_id': '{rid}'. Expected an ID that begins with 'resp'.",
        param="response_id",
        err_type=_INVALID,
    )


def _not_found(rid: str) -> ApiError:
    """`serving_responses._make_not_found_error`."""
    return ApiError(f"Response with id '{rid}' not found.", status=404, param="response_id", err_type=_INVALID)


def _check_model(state: SimState, model: str | None) -> None:
    """`serving_responses._validate_model`: the served name, an adapter's, or `base:adapter` with
    a known base. (The route passes no adapter to generation: `lora_path` is never set.)"""
    if model is None:
        return
    base, _ = parse_model_parameter(model, state.served_model_name)
    known = {state.served_model_name, *(a.lora_name for a in state.lora.adapters())}
    if model not in known and base not in known:
        raise ApiError(f"The model '{model}' does not exist", status=404, param="model", err_type=_INVALID)


def _thinking(state: SimState, body: ResponsesRequest) -> bool:
    """`require_reasoning` as the chat route decides it: K2.6 thinks unless
    `chat_template_kwargs.thinking` is false; `reasoning.effort: "none"` sets it false
    (`ResponsesRequest.normalize_reasoning_to_thinking`; an explicit kwarg wins)."""
    if state.profile.reasoning is None:
        return False
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning is not None and body.reasoning.effort == "none":
        kwargs = {"thinking": False, "enable_thinking": False, **kwargs}
    return kwargs.get("thinking") is not False


def _plan(state: SimState, body: ResponsesRequest) -> _Plan:
    """`create_responses` up to scheduling, in its order of checks. Raises ApiError."""
    tools = _tools(body.tools)
    store_on = state.options.enable_response_store
    if any(t.type == "shell" for t in tools):
        raise ApiError("Shell tools are not supported by this model", param="tools", err_type=_INVALID)
    if not store_on and body.previous_response_id is not None:
        raise _store_disabled("previous_response_id")
    if not store_on and body.background:
        raise _store_disabled("background")
    if body.background and not body.store:
        raise ApiError("background=true requires store=true.", param="store", err_type=_INVALID)
    _check_model(state, body.model)
    callable_tools = [t for t in tools if t.type == "function" or (t.type == "custom" and t.name)]
    if body.tool_choice == "required" and not any(t.type in ("function", "custom") for t in tools):
        raise ApiError(
            'tool_choice="required" requires at least one tool with type="function" or type="custom"; other'
            " built-in tool types cannot be forced.",
            err_type=_INVALID,
        )
    choice = _effective_tool_choice(body.tool_choice)
    if isinstance(choice, dict) and not any(
        t.type in ("function", "custom") and t.name == choice["name"] for t in tools
    ):
        raise ApiError(f"Tool {choice['name']!r} is not declared in tools", param="tool_choice", err_type=_INVALID)
    logprobs = bool(body.include and "message.output_text.logprobs" in body.include)
    if body.stream and logprobs:
        raise ApiError("logprobs are not supported in streaming mode", param="logprobs", err_type=_INVALID)
    prev = body.previous_response_id
    if prev is not None:
        if not prev.startswith("resp_"):
            raise _invalid_id(prev)
        if state.responses.get(prev) is None:
            raise _not_found(prev)
    history = state.responses.messages(prev) if prev is not None else []
    history += [{"role": "user", "content": body.input}] if isinstance(body.input, str) else list(body.input)
    turns = [(m.get("role", ""), _rendered(m)) for m in _messages(body.instructions, history)]
    conversation = render_chat(turns)
    chat_tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in callable_tools
    ]
    prompt = (f"tools: {json.dumps(chat_tools, ensure_ascii=False)}\n" if chat_tools else "") + conversation
    domain = classify(conversation)
    key = prompt_key(prompt)
    thinking = _thinking(state, body)
    effort = body.reasoning.effort if body.reasoning is not None else None
    echo = {
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "tool_choice": choice,
        "tools": [t.model_dump() for t in tools],
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": prev,
        "effort": effort if effort in ECHOABLE_REASONING_EFFORTS else None,
        "store": body.store,
        "temperature": body.temperature,
        "text": drop_none(body.text) if body.text is not None else None,
        "top_p": body.top_p,
        "truncation": body.truncation,
        "user": body.user,
        "metadata": body.metadata or {},
    }
    # `to_sampling_params`: max_output_tokens less 2 of headroom for BOS/EOS; without it none, as
    # on the chat route (`generation.unbounded_budget`)
    prompt_tokens = count_prompt_tokens(prompt)
    max_new = body.max_output_tokens - 2 if body.max_output_tokens is not None else None
    max_new = unbounded_budget(state, prompt_tokens) if max_new is None else max_new
    return _Plan(
        body=body,
        rid=body.request_id or f"resp_{uuid.uuid4().hex}",
        created=int(time.time()),
        echo=echo,
        history=history,
        persist=store_on and bool(body.store),
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new,
        domain=domain,
        key=key,
        thinking=thinking,
        reasoning=reasoning_tokens(state.profile.reasoning, domain, key) if thinking else 0,
        split=state.options.reasoning_parser is not None,
        hold_message=bool(callable_tools) and choice != "none",
    )


# ------------------------------------------------------------------------------ generation


async def _admit(state: SimState, plan: _Plan) -> Generation:
    """The chat route's admission (limits, faults, prefix cache, engine); the rid is the response id.
    No priority: `serving_responses.py` never forwards the request's (the server's default applies,
    `tokenizer_manager.py: _set_default_priority`). Sampling values are checked here, as
    `SamplingParams.verify` checks them once generation is asked for: an error is then the
    generation's (a 400 unstreamed, `response.failed` in an open stream)."""
    temperature, top_p = sampling_values(state, plan.body.temperature, plan.body.top_p)
    return await admit(
        state,
        plan.rid,
        plan.prompt,
        plan.prompt_tokens,
        plan.max_new_tokens,
        domain=plan.domain,
        key=plan.key,
        temperature=temperature,
        top_p=top_p,
        # `ResponsesRequest` has no ignore_eos: the answer always ends where the model ends it
        stop_after_tokens=natural_stop(state.profile.answer, plan.domain, plan.key, plan.reasoning),
    )


class _Turn:
    """One turn's tokens through the kimi_k2 reasoning parser (`--reasoning-parser kimi_k2`, which
    the Responses route always runs with `separate_reasoning`): text before `</think>` is
    reasoning, after it the answer; without the parser everything is the answer."""

    def __init__(self, gen: Generation, plan: _Plan) -> None:
        self.script = OutputScript(gen.seed, plan.reasoning, None)
        self._split = plan.split
        self._in_reasoning = plan.split and plan.thinking
        self._counts = plan.split and plan.thinking  # reasoning_tokens only when required
        self.reasoning_tokens = 0
        self.reasoning = ""
        self.text = ""

    def take(self, n: int) -> tuple[str, str]:
        """(reasoning, answer text) of the next `n` tokens."""
        reasoning, text = [], []
        for piece, part in self.script.take(n):
            if self._counts and part in ("reasoning", "think_end"):
                self.reasoning_tokens += 1
            if self._in_reasoning:
                if part == "think_end":
                    self._in_reasoning = False
                else:
                    reasoning.append(piece)
            else:
                text.append(piece)
        r, t = "".join(reasoning), "".join(text)
        self.reasoning += r
        self.text += t
        return r, t

    def cache(self, gen: Generation) -> None:
        """Into the prefix cache as the chat route puts a turn (`openai_api._cache_answer`)."""
        gen.cache_output("".join(self.script.text_parts) + "\n", "assistant: ")


def _usage(gen: Generation, turn: _Turn) -> dict[str, Any]:
    return responses_usage(gen.prompt_tokens, gen.completion_tokens, turn.reasoning_tokens, gen.cached_tokens)


def _failure(gen: Generation) -> dict[str, Any] | None:
    """`_error_from_finish_reason` of an aborted generation."""
    if gen.finish_reason != "abort":
        return None
    reason = gen.meta_info(finished=True)["finish_reason"]
    return response_error(reason.get("message") if isinstance(reason, dict) else None)


def _keep(state: SimState, plan: _Plan, response: dict[str, Any]) -> None:
    """Store a finished response with its conversation (input items, then its output items
    without nulls), unless it was cancelled meanwhile (`responses_full_generator`)."""
    if not plan.persist:
        return
    stored = state.responses.get(plan.rid)
    if stored is not None and stored.get("status") == "cancelled":
        return
    state.responses.put(plan.rid, response, plan.history + [drop_none(i) for i in response["output"]])


def _model_error(model: str | None) -> ApiError | None:
    """`model` omitted: `ResponsesResponse(model=None)` fails its pydantic validation once the
    output is built, answered `create_error_response(str(e))` (`create_responses`)."""
    if model is not None:
        return None

    class ResponsesResponse(BaseModel):
        model: str

    try:
        ResponsesResponse.model_validate({"model": None})
    except ValidationError as e:
        return ApiError(str(e), err_type=_INVALID)
    return None  # pragma: no cover


async def _generate(state: SimState, plan: _Plan, gen: Generation) -> dict[str, Any]:
    """`responses_full_generator`: every step, then the response object."""
    turn = _Turn(gen, plan)
    async for n in gen.steps():
        turn.take(n)
    summary = plan.body.reasoning is not None and plan.body.reasoning.summary is not None
    output: list[dict[str, Any]] = []
    if turn.reasoning:
        output.append(reasoning_item(f"rs_{uuid.uuid4().hex}", turn.reasoning, "completed", summary))
    if turn.text:
        output.append(message_item(f"msg_{uuid.uuid4().hex}", turn.text, "completed"))
    status = status_from_finish(gen.finish_reason)
    response = response_object(
        plan.echo, plan.rid, plan.created, plan.body.model, output, status, _usage(gen, turn), _failure(gen)
    )
    turn.cache(gen)
    return response


def _generation_error(e: ApiError) -> ApiError:
    """An error raised once generation is asked for, as `create_responses` answers it unstreamed:
    ValueErrors (context length, sampling) 400 with their text; a scheduler abort's HTTPException(503)
    (the full queue, eviction by a higher priority) is caught by the generic handler, so 400 with
    `str(exc)`, e.g. "503: The request queue is full."."""
    if isinstance(e, SchedulerAbort):
        return ApiError(f"503: {e.message}", err_type=_INVALID)
    if e.status == 400:
        return ApiError(e.message, err_type=_INVALID)
    return e  # a fault knob's 5xx (not SGLang's)


def _json(body: dict[str, Any]) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def _respond(state: SimState, plan: _Plan) -> web.Response:
    try:
        gen = await _admit(state, plan)
    except ApiError as e:
        return responses_error(_generation_error(e))
    try:
        response = await _generate(state, plan, gen)
    finally:
        gen.release()  # client gone (handler cancelled) or finished: the slot is freed
    if gen.abort_error is not None:  # evicted by a higher priority (or retracted into a full queue)
        return responses_error(_generation_error(gen.abort_error))
    error = _model_error(plan.body.model)
    if error is not None:
        return responses_error(error)
    _keep(state, plan, response)
    return _json(response)


# ----------------------------------------------------------------------------------- stream


async def _stream(request: web.Request, state: SimState, plan: _Plan) -> web.StreamResponse:
    """`_responses_stream_generator_non_harmony`: headers and the first two events at once, then
    one delta event per engine step, the items closed, the terminal event; no `[DONE]`."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    if plan.body.model is None:  # `from_request` raises before the first event: the connection drops
        if request.transport is not None:
            request.transport.close()
        return resp
    summary = plan.body.reasoning is not None and plan.body.reasoning.summary is not None
    events = ResponseEvents(summary, plan.hold_message)
    echo, rid, model = plan.echo, plan.rid, plan.body.model
    gen: Generation | None = None
    try:
        initial = response_object(echo, rid, plan.created, model, [], "in_progress", None)
        await resp.write(events.lifecycle("created", initial) + events.lifecycle("in_progress", initial))
        try:
            gen = await _admit(state, plan)
        except ApiError as e:
            await resp.write(_stream_failure(state, plan, events, e))
            await resp.write_eof()
            return resp
        turn = _Turn(gen, plan)
        try:
            async for n in gen.steps():
                out = events.step(*turn.take(n))
                if out:
                    await resp.write(out)
            if gen.abort_error is not None and not gen.completion_tokens:  # aborted while it waited
                await resp.write(_stream_failure(state, plan, events, gen.abort_error))
                await resp.write_eof()
                return resp
            tail = events.close()
            status = status_from_finish(gen.finish_reason)
            final = response_object(
                echo, rid, plan.created, model, events.output, status, _usage(gen, turn), _failure(gen)
            )
            _keep(state, plan, final)
            await resp.write(tail + events.lifecycle(status, final))
            await resp.write_eof()
            turn.cache(gen)
        finally:
            gen.release()
    except ConnectionResetError:  # client gone: the engine request is aborted, as on chat
        if gen is not None:
            state.runtime.abort(gen.rid)
    return resp


def _stream_failure(state: SimState, plan: _Plan, events: ResponseEvents, e: ApiError) -> bytes:
    """A generation that fails once the stream is open ends with `response.failed`: a scheduler
    abort (status 503: the full queue, eviction by a higher priority) reaches the generator as a
    finished output, so the response carries usage and is stored; an exception (context length,
    ...) is caught by the generator: output [], usage null, not stored."""
    if isinstance(e, SchedulerAbort):
        usage = responses_usage(plan.prompt_tokens, 0, 0, 0)
        failed = response_object(
            plan.echo, plan.rid, plan.created, plan.body.model, [], "failed", usage, response_error(e.message)
        )
        _keep(state, plan, failed)
    else:
        error = {"code": "server_error", "message": e.message}
        failed = response_object(plan.echo, plan.rid, plan.created, plan.body.model, [], "failed", None, error)
    return events.lifecycle("failed", failed)


# ------------------------------------------------------------------------------- background


def _start_background(state: SimState, plan: _Plan) -> web.Response:
    """`background: true` (not streamed): the response is stored "queued" and returned at once;
    a task runs the generation (`_run_background_request`), free of the client's connection."""
    queued = response_object(plan.echo, plan.rid, plan.created, plan.body.model, [], "queued", None)
    state.responses.put(plan.rid, dict(queued), plan.history)
    store = state.responses
    task = asyncio.create_task(_run_background(state, plan), name=f"create_{plan.rid}")
    store.tasks[plan.rid] = task
    task.add_done_callback(lambda _: store.tasks.pop(plan.rid, None))
    return _json(queued)


async def _run_background(state: SimState, plan: _Plan) -> None:
    stored = state.responses.get(plan.rid)
    if stored is not None:
        stored["status"] = "in_progress"
    try:
        gen = await _admit(state, plan)
    except ApiError:
        _mark_failed(state, plan.rid)
        return
    try:
        response = await _generate(state, plan, gen)
    finally:
        gen.release()
    if gen.abort_error is not None:  # the scheduler's HTTPException(503), as an admission error
        _mark_failed(state, plan.rid)
        return
    _keep(state, plan, response)


def _mark_failed(state: SimState, rid: str) -> None:
    """A background generation that answered an error: "failed" unless completed or cancelled."""
    stored = state.responses.get(rid)
    if stored is not None and stored.get("status") not in ("completed", "cancelled"):
        stored["status"] = "failed"


# ----------------------------------------------------------------------------------- routes


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:
        body: ResponsesRequest = await decode_body(request, ResponsesRequest)
        request_priority(body.priority, _ENDPOINT, optional=False)  # checked, then unused (see above)
        plan = _plan(state, body)
    except ApiError as e:
        return responses_error(e)
    if body.background and not body.stream:
        if body.model is None:  # the queued `ResponsesResponse` fails validation, uncaught: a bare 500
            return web.Response(status=500, text="Internal Server Error")
        return _start_background(state, plan)
    if body.stream:
        return await _stream(request, state, plan)
    return await _respond(state, plan)


def _stored(state: SimState, rid: str) -> dict[str, Any]:
    """`retrieve_responses` / `cancel_responses` checks, in order. Raises ApiError."""
    if not state.options.enable_response_store:
        raise _store_disabled("response_id")
    if not rid.startswith("resp_"):
        raise _invalid_id(rid)
    response = state.responses.get(rid)
    if response is None:
        raise _not_found(rid)
    return response


async def retrieve_response(request: web.Request) -> web.Response:
    """`GET /v1/responses/{response_id}`: the stored response as it stands."""
    try:
        return _json(_stored(request.app[STATE_KEY], request.match_info["response_id"]))
    except ApiError as e:
        return responses_error(e)


async def cancel_response(request: web.Request) -> web.Response:
    """`POST /v1/responses/{response_id}/cancel`: a queued or in-progress (background) response
    becomes "cancelled", its generation is aborted and its task cancelled; a terminal one is
    returned as it is."""
    state = request.app[STATE_KEY]
    rid = request.match_info["response_id"]
    try:
        response = _stored(state, rid)
    except ApiError as e:
        return responses_error(e)
    if response.get("status") not in ("queued", "in_progress"):
        return _json(response)
    response["status"] = "cancelled"
    state.runtime.abort(rid)
    task = state.responses.tasks.get(rid)
    if task is not None:
        task.cancel()
        await asyncio.wait([task])
    return _json(response)


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/responses", create_response),
        web.get("/v1/responses/{response_id}", retrieve_response),
        web.post("/v1/responses/{response_id}/cancel", cancel_response),
    ]
