"""One request against an OpenAI-compatible target, timed the way the metrics need it.

aiohttp rather than the openai SDK: the SDK's per-chunk pydantic work costs more CPU than a load
generator can spend. The body is encoded once with msgspec; each read of the response is stamped
with `perf_counter()` and handed to the pure `StreamParser`. Every failure becomes an error kind
on the record (never an exception out of `send`), so a level always accounts for all requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import msgspec

from loadgen.datasets import Prompt
from loadgen.metrics import Gap, measure
from loadgen.stream import ContentChunk, SpecDetails, StreamParser, Usage, first_spec
from loadgen.summary import RequestRecord

BACKEND_HEADER = "x-specroute-backend"
# Join keys: a gateway's access log has the request id, its tracing backend the trace id.
REQUEST_ID_HEADER = "x-request-id"
TRACE_ID_HEADER = "x-specroute-trace-id"


class RequestOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Per-run request settings (see the CLI for their meaning and defaults)."""

    max_tokens: int = 256
    endpoint: str = "chat"  # chat | completions
    stream: bool = True
    spec_details: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    api_key: str | None = None
    timeout: float = 600.0  # seconds without a byte before a request counts as timed out


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


def build_body(target: Target, prompt: Prompt, opts: RequestOptions) -> bytes:
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": prompt.max_tokens or opts.max_tokens,
        "temperature": opts.temperature,
        "stream": opts.stream,
    }
    if opts.endpoint == "chat":
        body["messages"] = [{"role": m.role, "content": m.content} for m in prompt.messages]
    else:
        body["prompt"] = prompt.text
    if opts.stream:
        body["stream_options"] = {"include_usage": True}
    if opts.spec_details:
        body["return_spec_tokens_details"] = True
    if opts.ignore_eos:
        body["ignore_eos"] = True
    return msgspec.json.encode(body)


def endpoint_url(target: Target, opts: RequestOptions) -> str:
    path = "/v1/chat/completions" if opts.endpoint == "chat" else "/v1/completions"
    return target.url.rstrip("/") + path


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


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
    except msgspec.DecodeError:
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
) -> list[Gap]:
    """Send one request, fill `record` (ok, error kind, timings, tokens); return ITL samples."""
    body = build_body(target, prompt, opts) if body is None else body
    parser = StreamParser()
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
                _parse_full(raw, parser, t_end, record)
    except asyncio.TimeoutError:
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
    gaps = measure(parser, t_send=t_send, t_end=t_end, streamed=opts.stream, record=record)
    return gaps if record.ok else []


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


def _parse_full(raw: bytes, parser: StreamParser, t_end: float, record: RequestRecord) -> None:
    """A non-streamed response becomes one content chunk arriving at the end."""
    try:
        full = _full_decoder.decode(raw)
    except msgspec.DecodeError as e:
        _fail(record, "bad_response", f"undecodable response: {e}")
        return
    if not full.choices:
        _fail(record, "bad_response", "response has no choices")
        return
    choice = full.choices[0]
    text = choice.text or ""
    if choice.message is not None:
        text = (choice.message.content or "") + (choice.message.reasoning_content or "")
    if text:
        parser.chunks.append(ContentChunk(t_end, len(text), None))
    parser.usage = full.usage
    parser.finish_reason = choice.finish_reason
    if full.sglext is not None:
        parser.spec = first_spec(full.sglext.spec_tokens_details)
    record.ok = True
