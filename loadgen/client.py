"""One request against an OpenAI-compatible target, timed the way the metrics need it.

aiohttp rather than the openai SDK: the SDK's per-chunk pydantic work costs more CPU than a load
generator can spend. The body is encoded once with msgspec; each read of the response is stamped
with `perf_counter()` and handed to the pure `StreamParser`. Every failure becomes an error kind
on the record (never an exception out of `send`), so a level always accounts for all requests.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from common.stream_clock import ChatDelta, Choice, Chunk, ToolCallDelta
from loadgen import responses
from loadgen.datasets import Prompt
from loadgen.k26 import k26_mode
from loadgen.metrics import Gap, measure
from loadgen.stream import AnswerText, SpecDetails, StreamParser, Usage, first_spec
from loadgen.summary import RequestRecord

BACKEND_HEADER = "x-specroute-backend"
# Join keys: a gateway's access log has the request id, its tracing backend the trace id.
REQUEST_ID_HEADER = "x-request-id"
TRACE_ID_HEADER = "x-specroute-trace-id"


THINKING_MODES = ("default", "on", "off", "mix")
ENDPOINTS = ("chat", "completions", "responses")
_MESSAGE_ENDPOINTS = frozenset({"chat", "responses"})  # messages, tools and thinking; not completions


class RequestOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Per-run request settings (see the CLI for their meaning and defaults). A dataset entry's own
    max_tokens / thinking / temperature / top_p / priority win over these."""

    max_tokens: int = 256
    endpoint: str = "chat"  # chat | completions | responses
    stream: bool = True
    spec_details: bool = True
    ignore_eos: bool | None = None  # None: on, except for requests that offer tools (they must stop to call)
    temperature: float = 0.0  # the first of `temperatures`, kept for callers that set one
    temperatures: tuple[float, ...] = ()  # a mix: request i (session i) gets temperatures[i % len]
    top_p: float | None = None
    # SGLang's `priority`, a mix taken like `temperatures`; empty: none sent (the body is as without it)
    priorities: tuple[int, ...] = ()
    thinking: str = "default"  # default (send nothing) | on | off | mix (alternate by request / session)
    continuous_usage: bool = True  # stream_options.continuous_usage_stats: exact tokens per chunk
    save_chunks: bool = False  # requests.jsonl keeps each chunk's arrival time and token count
    api_key: str | None = None
    timeout: float = 600.0  # seconds without a byte before a request counts as timed out
    # responses + sessions: store every turn on the server, send later ones as previous_response_id
    # plus the new user message (the driver's session loop; see loadgen/responses.py)
    chain_responses: bool = False
    # sessions: mean seconds from an answer to the next turn (exponential); 0: at once
    think_time_s: float = 0.0
    # K2.6's settings (loadgen.k26): this share of requests (sessions) think at temperature 1.0, the
    # rest answer at 0.6, top_p 0.95; None: --thinking / --temperature / --top-p decide
    thinking_share: float | None = None
    seed: int = 0  # the run's seed: which requests think under thinking_share


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """What one request is sent with, after the dataset entry and the run's options are combined."""

    max_tokens: int
    temperature: float
    top_p: float | None
    thinking: bool | None  # None: the server's default (no chat_template_kwargs)
    ignore_eos: bool
    priority: int | None = None  # None: no `priority` field in the body


def settings(prompt: Prompt, opts: RequestOptions, index: int) -> Settings:
    """`index` picks from the run's mixes: the request's index, or its session's for a session."""
    temps = opts.temperatures or (opts.temperature,)
    thinking: bool | None = {"on": True, "off": False, "mix": index % 2 == 0}.get(opts.thinking)
    top_p = opts.top_p
    if opts.thinking_share is not None:
        mode = k26_mode(opts.thinking_share, opts.seed, index)
        thinking, temps, top_p = mode.thinking, (mode.temperature,), mode.top_p
    if prompt.thinking is not None:
        thinking = prompt.thinking
    ignore_eos = opts.ignore_eos if opts.ignore_eos is not None else not prompt.tools
    if prompt.ignore_eos is not None:  # a generated dataset that plans its lengths
        ignore_eos = prompt.ignore_eos
    priority = opts.priorities[index % len(opts.priorities)] if opts.priorities else None
    if prompt.priority is not None:
        priority = prompt.priority
    return Settings(
        max_tokens=prompt.max_tokens or opts.max_tokens,
        temperature=prompt.temperature if prompt.temperature is not None else temps[index % len(temps)],
        top_p=prompt.top_p if prompt.top_p is not None else top_p,
        thinking=thinking,
        ignore_eos=ignore_eos,
        priority=priority,
    )


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """A resolved target: its label as given on the command line, base URL and model."""

    label: str
    url: str
    model: str


def headers(opts: RequestOptions) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if opts.api_key:
        h["Authorization"] = f"Bearer {opts.api_key}"
    return h


def build_body(
    target: Target,
    prompt: Prompt,
    opts: RequestOptions,
    s: Settings | None = None,
    *,
    store: bool = False,
    previous_response_id: str | None = None,
) -> bytes:
    """`store` and `previous_response_id`: `--endpoint responses` only (a chained session turn)."""
    s = s or settings(prompt, opts, 0)
    if opts.endpoint == "responses":
        out = responses.body(
            target.model, prompt, s, stream=opts.stream, store=store, previous_response_id=previous_response_id
        )
        return msgspec.json.encode(out)
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "stream": opts.stream,
    }
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if opts.endpoint == "chat":
        body["messages"] = prompt.messages
        if prompt.tools:
            body["tools"] = prompt.tools
            if prompt.tool_choice is not None:
                body["tool_choice"] = prompt.tool_choice
        if s.thinking is not None:
            body["chat_template_kwargs"] = {"thinking": s.thinking}
    else:
        body["prompt"] = prompt.text
    if opts.stream:
        body["stream_options"] = {"include_usage": True}
        if opts.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    if opts.spec_details:
        body["return_spec_tokens_details"] = True
    if s.ignore_eos:
        body["ignore_eos"] = True
    if s.priority is not None:
        body["priority"] = s.priority
    return msgspec.json.encode(body)


def endpoint_url(target: Target, opts: RequestOptions) -> str:
    path = {"chat": "/v1/chat/completions", "responses": responses.PATH}.get(opts.endpoint, "/v1/completions")
    return target.url.rstrip("/") + path


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class _FullChoice(msgspec.Struct):
    message: _Message | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Sglext(msgspec.Struct):
    spec_tokens_details: SpecDetails | list[SpecDetails] | None = None


class _FullResponse(msgspec.Struct):
    choices: list[_FullChoice] = []
    usage: Usage | None = None
    sglext: _Sglext | None = None


class _ErrorInner(msgspec.Struct):
    message: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorInner | str | None = None  # OpenAI nested shape, /generate string
    message: str | None = None  # SGLang's flat shape


_full_decoder = msgspec.json.Decoder(_FullResponse)
_error_decoder = msgspec.json.Decoder(_ErrorBody)


def error_message(body: bytes) -> str:
    """The human part of an error body in any of the shapes the targets use."""
    try:
        e = _error_decoder.decode(body)
    except JSON_DECODE_ERRORS:
        return body[:200].decode(errors="replace").strip() or "(empty body)"
    if isinstance(e.error, _ErrorInner) and e.error.message:
        return e.error.message
    if isinstance(e.error, str):
        return e.error
    return e.message or body[:200].decode(errors="replace")


async def send(
    session: aiohttp.ClientSession,
    target: Target,
    prompt: Prompt,
    opts: RequestOptions,
    record: RequestRecord,
    *,
    body: bytes | None = None,
    index: int = 0,
    keep_answer: bool = False,
    store: bool = False,
    previous_response_id: str | None = None,
) -> Sent:
    """Send one request, fill `record` (ok, error kind, timings, tokens, what it was sent with);
    return its ITL samples and, with `keep_answer`, the answer (what a session sends back next).
    `store`, `previous_response_id`: a chained `--endpoint responses` turn (`build_body`)."""
    s = settings(prompt, opts, index)
    messages = opts.endpoint in _MESSAGE_ENDPOINTS
    record.thinking = s.thinking if messages else None
    record.temperature = s.temperature
    record.priority = s.priority
    record.tools = len(prompt.tools or ()) if messages else 0
    if body is None:
        body = build_body(target, prompt, opts, s, store=store, previous_response_id=previous_response_id)
    parser_type = responses.ResponsesStreamParser if opts.endpoint == "responses" else StreamParser
    parser = parser_type(keep_answer=keep_answer or prompt.tools is not None)
    t_send = time.perf_counter()
    got_response = False
    try:
        async with session.post(endpoint_url(target, opts), data=body, headers=headers(opts)) as resp:
            got_response = True
            record.status = resp.status
            record.backend = resp.headers.get(BACKEND_HEADER)
            record.request_id = resp.headers.get(REQUEST_ID_HEADER)
            record.trace_id = resp.headers.get(TRACE_ID_HEADER)
            if resp.status != 200:
                detail = error_message(await resp.read())
                _fail(record, f"http_{resp.status}", detail)
                t_end = time.perf_counter()
            elif opts.stream:
                now = time.perf_counter
                async for data in resp.content.iter_any():
                    parser.feed(data, now())
                t_end = now()
                parser.close(t_end)
                _check_stream(parser, record)
            else:
                raw = await resp.read()
                t_end = time.perf_counter()
                if opts.endpoint == "responses":
                    _parse_responses(raw, parser, t_end, record)
                else:
                    _parse_full(raw, parser, t_end, record)
    except TimeoutError:
        t_end = time.perf_counter()
        _fail(record, "timeout", f"no data for {opts.timeout:g}s")
    except aiohttp.ClientConnectorError as e:
        t_end = time.perf_counter()
        _fail(record, "connect", str(e.os_error) if e.os_error else str(e))
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        t_end = time.perf_counter()
        _fail(record, "broken_stream" if got_response else "connect", str(e) or type(e).__name__)
    except aiohttp.ClientError as e:
        t_end = time.perf_counter()
        _fail(record, "bad_response", str(e) or type(e).__name__)
    gaps = measure(
        parser, t_send=t_send, t_end=t_end, streamed=opts.stream, record=record, save_chunks=opts.save_chunks
    )
    return Sent(gaps if record.ok else [], parser.answer if record.ok else None)


class Sent(msgspec.Struct):
    """What `send` hands back besides the record."""

    gaps: list[Gap]
    answer: AnswerText | None  # when kept and the request succeeded


def _fail(record: RequestRecord, kind: str, detail: str) -> None:
    if record.error is None:  # keep the first cause
        record.ok = False
        record.error = kind
        record.error_detail = detail[:300]


def _check_stream(parser: StreamParser, record: RequestRecord) -> None:
    kind, detail = parser.outcome()
    if kind is None:
        record.ok = True
    else:
        _fail(record, kind, detail or kind)


def _parse_responses(raw: bytes, parser: StreamParser, t_end: float, record: RequestRecord) -> None:
    failure = responses.parse_full(raw, parser, t_end)
    if failure is None:
        record.ok = True
    else:
        _fail(record, *failure)


def _parse_full(raw: bytes, parser: StreamParser, t_end: float, record: RequestRecord) -> None:
    """A non-streamed response enters the clock as one chunk arriving at the end."""
    try:
        full = _full_decoder.decode(raw)
    except JSON_DECODE_ERRORS as e:
        _fail(record, "bad_response", f"undecodable response: {e}")
        return
    if not full.choices:
        _fail(record, "bad_response", "response has no choices")
        return
    choice = full.choices[0]
    m = choice.message
    if m is not None:
        delta = ChatDelta(content=m.content, reasoning_content=m.reasoning_content, tool_calls=m.tool_calls)
        chunk = Chunk(choices=[Choice(delta=delta, finish_reason=choice.finish_reason)], usage=full.usage)
    else:
        chunk = Chunk(choices=[Choice(text=choice.text, finish_reason=choice.finish_reason)], usage=full.usage)
    parser.observe(chunk, t_end)
    if full.sglext is not None:
        parser.spec = first_spec(full.sglext.spec_tokens_details)
    record.ok = True
