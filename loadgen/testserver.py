"""A zero-delay SGLang-compatible streaming server: loadgen's yardstick and test double.

It answers `/v1/chat/completions` and `/v1/completions` (streamed and not) in the chunk shapes and
order of SGLang 0.5.23 (`entrypoints/openai/serving_chat.py`, `sse_utils.py`,
`serving_completions.py`; the byte fixtures in tests/fixtures/streams are the reference):

- chat: the role chunk `{"reasoning_content": null, "role": "assistant", "content": ""}` with the first
  step; per step a reasoning chunk, then content or tool-call chunks; the finish chunk
  `{"reasoning_content": null}` with `finish_reason` (and `matched_stop` on a stop); one `sglext`
  chunk when spec details were asked for; one usage chunk when `include_usage`; `[DONE]`;
- completions: one chunk per step, `finish_reason` on the last text chunk;
- `stream_options.continuous_usage_stats`: the step's cumulative usage on every reasoning / content /
  tool-call chunk (never on the role or finish chunk).

Options imitate what loadgen must measure: speculation (`tokens_per_chunk`, or a cycling
`chunk_pattern` of tokens per step), a reasoning parser (`reasoning_tokens` of thinking first,
off with `chat_template_kwargs: {"thinking": false}`; the `</think>` token makes no chunk and
counts as reasoning), tool calls (a request with `tools` gets a call of its first tool, ending in
`finish_reason: "tool_calls"`), a prefix cache (`enable_cache_report`: cached tokens = the longest
word prefix shared with an earlier prompt), mid-stream errors, HTTP errors and SGLang's streamed
queue-full answer (200, `data: {"error": {... "code": 503}}`, `[DONE]`).

It counts what it did (`/stats`): requests, tokens, chunks and the peak number of requests in
flight, which is how tests prove the closed loop never overshoots and how the self-benchmark
checks loadgen's throughput against a server-side count. With `log_steps` it keeps, per request
(`x-request-id` header), when each step was written and its cumulative token count (`/steps`; the
last 512 requests): the server-side truth a per-token ITL computation can be checked against.

    python -m loadgen.testserver --port 8123 [--tokens-per-chunk 4] [--chunk-delay 0]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import time
from typing import Any

import msgspec
from aiohttp import web

from common.json_errors import JSON_DECODE_ERRORS

_enc = msgspec.json.Encoder()
EOS_ID = 163586  # matched_stop of a natural stop (Kimi K2's end-of-turn token id)
MAX_LOGGED_REQUESTS = 512
MAX_CACHED_PROMPTS = 256


class ServerConfig(msgspec.Struct, kw_only=True):
    model: str = "test-model"
    backend_name: str | None = None  # sent as x-specroute-backend when set
    tokens_per_chunk: int = 1  # > 1 imitates speculation: one chunk per verify step
    chunk_pattern: list[int] = []  # tokens per step, cycled (overrides tokens_per_chunk)
    speculative: bool = False  # answer return_spec_tokens_details with sglext
    chunk_delay: float = 0.0  # seconds between steps (0: as fast as possible)
    api_key: str | None = None  # require this bearer token
    error_every: int = 0  # every Nth request fails mid-stream with data: {"error": ...}
    error_after_chunks: int = 2  # content chunks sent before that error
    http_error_every: int = 0  # every Nth request answers HTTP 503 in SGLang's flat shape
    queue_full_every: int = 0  # every Nth streamed request gets SGLang's queue-full stream
    hold_until_inflight: int = 0  # requests wait until this many are in flight (max 5 s)
    continuous_usage: bool = False  # usage on every chunk even when not asked for
    reasoning_tokens: int = 0  # > 0: a reasoning parser is on; this many thinking tokens first
    tool_calls: bool = True  # a request with tools gets a call of its first tool
    enable_cache_report: bool = False  # report usage.prompt_tokens_details.cached_tokens
    log_steps: bool = False  # keep per-request step times and token counts (/steps)
    keep_bodies: int = 0  # keep the last N request bodies (`TestServer.bodies`, for in-process tests)
    backends: list[dict[str, Any]] = []  # served at /admin/backends, as the gateway does


class Stats(msgspec.Struct):
    requests: int = 0
    inflight: int = 0
    max_inflight: int = 0
    tokens: int = 0  # completion tokens of finished requests
    chunks: int = 0  # content chunks written
    first_request: float | None = None  # time.time() of the first request
    last_end: float | None = None  # time.time() the last request finished


class StepLog(msgspec.Struct):
    """One streamed request as the server wrote it: per step, seconds after the first step and the
    cumulative completion tokens after it."""

    request_id: str
    times: list[float] = []
    tokens: list[int] = []
    chunks: list[int] = []  # chunks with generated output the step wrote (0: a marker, no text)


_WORDS = [f" w{i}" for i in range(97)]
_THOUGHT = [f" t{i}" for i in range(53)]


class _Token(msgspec.Struct, array_like=True):
    kind: str  # reasoning | think_end | content | call_name | call_args | eos
    text: str = ""


class _Step(msgspec.Struct, kw_only=True):
    """One decode step: how many tokens it made and the text the parsers made of them."""

    tokens: int
    reasoning_tokens: int
    reasoning: str
    content: str
    calls: list[_Token]


class TestServer:
    """The aiohttp application plus its counters; `app` is ready to run."""

    __test__ = False  # not a pytest test class

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.stats = Stats()
        self.steps: collections.deque[StepLog] = collections.deque(maxlen=MAX_LOGGED_REQUESTS)
        self.bodies: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.config.keep_bodies or None)
        self._prompts: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()
        self._ids = itertools.count(1)
        self._gate = asyncio.Event()
        self.app = web.Application()
        r = self.app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._ok)
        r.add_get("/ready", self._ok)
        r.add_get("/stats", self._stats)
        r.add_get("/steps", self._steps)
        r.add_post("/stats/reset", self._reset)
        r.add_get("/admin/backends", self._backends)

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=_enc.encode(self.stats), content_type="application/json")

    async def _steps(self, request: web.Request) -> web.Response:
        return web.Response(body=_enc.encode(list(self.steps)), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        self.stats = Stats()
        self.steps.clear()
        return web.Response(status=200)

    async def _backends(self, request: web.Request) -> web.Response:
        return web.Response(body=_enc.encode({"backends": self.config.backends}), content_type="application/json")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        body = {"object": "list", "data": [{"id": self.config.model, "object": "model", "owned_by": "sglang"}]}
        return web.Response(body=_enc.encode(body), content_type="application/json")

    def _auth(self, request: web.Request) -> web.Response | None:
        key = self.config.api_key
        if key and request.headers.get("Authorization") != f"Bearer {key}":
            return _flat_error(401, "Unauthorized")
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = msgspec.json.decode(await request.read())
        except JSON_DECODE_ERRORS:
            return _flat_error(400, "malformed JSON")
        if not isinstance(body, dict):
            return _flat_error(400, "the body must be a JSON object")
        if self.config.keep_bodies:
            self.bodies.append(body)
        st = self.stats
        st.requests += 1
        nth = st.requests
        if st.first_request is None:
            st.first_request = time.time()
        st.inflight += 1
        st.max_inflight = max(st.max_inflight, st.inflight)
        try:
            cfg = self.config
            if cfg.hold_until_inflight:
                if st.inflight >= cfg.hold_until_inflight:
                    self._gate.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._gate.wait(), 5.0)
            if cfg.http_error_every and nth % cfg.http_error_every == 0:
                return _flat_error(503, "injected overload")
            rid = f"{next(self._ids):032x}"
            headers = {"x-request-id": rid}
            if cfg.backend_name:
                headers["x-specroute-backend"] = cfg.backend_name
            ex = _Exchange(self, body, chat, rid)
            if body.get("stream"):
                if cfg.queue_full_every and nth % cfg.queue_full_every == 0:
                    return await self._queue_full(request, headers)
                fail = bool(cfg.error_every and nth % cfg.error_every == 0)
                return await ex.stream(request, headers, fail)
            return ex.full(headers)
        finally:
            st.inflight -= 1
            st.last_end = time.time()

    async def _queue_full(self, request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
        """SGLang's answer to a streamed request that finds the queue full (--max-queued-requests):
        HTTP 200, one error event, [DONE] (serving_base.create_streaming_error_response)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        err = {
            "error": {
                "object": "error",
                "message": "The request queue is full.",
                "type": "SERVICE_UNAVAILABLE",
                "param": None,
                "code": 503,
            }
        }
        await resp.write(f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    def cached_prefix(self, words: tuple[str, ...]) -> int:
        """Longest word prefix shared with an earlier prompt (the radix cache's hit), then remember
        this prompt (bounded, least recently used out)."""
        best = 0
        for seen in self._prompts:
            n = 0
            for a, b in zip(seen, words, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._prompts[words] = None
        self._prompts.move_to_end(words)
        while len(self._prompts) > MAX_CACHED_PROMPTS:
            self._prompts.popitem(last=False)
        return min(best, max(0, len(words) - 1))  # the last prompt token is always computed


class _Exchange:
    """One request: the tokens it will generate, and how they are written."""

    def __init__(self, server: TestServer, body: dict[str, Any], chat: bool, rid: str) -> None:
        cfg = server.config
        self.server, self.cfg, self.body, self.chat, self.rid = server, cfg, body, chat, rid
        self.model = body.get("model")
        self.created = int(time.time())  # one per response, as SGLang's
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.n = int(body.get("max_tokens") or 16)
        words = _prompt_words(body)
        self.prompt_tokens = len(words)
        self.cached = server.cached_prefix(words) if cfg.enable_cache_report else 0
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = chat and cfg.reasoning_tokens > 0 and kwargs.get("thinking") is not False
        separate = body.get("separate_reasoning", True) is not False
        tools = body.get("tools") if chat else None
        self.tool = (
            tools[0]["function"]["name"] if tools and cfg.tool_calls and body.get("tool_choice") != "none" else None
        )
        self.tokens = self._plan(thinking)
        self.separate = separate
        self.reasoning_total = sum(1 for t in self.tokens if t.kind in ("reasoning", "think_end"))
        self.finish = (
            "tool_calls" if self.tool else ("stop" if self.tokens and self.tokens[-1].kind == "eos" else "length")
        )

    def _plan(self, thinking: bool) -> list[_Token]:
        n, out = self.n, []
        if thinking:
            r = min(self.cfg.reasoning_tokens, max(0, n - 1))
            out += [_Token("reasoning", _THOUGHT[i % 53]) for i in range(r)]
            if len(out) < n:
                out.append(_Token("think_end"))
        if self.tool is not None:
            # name (the call header tokens), arguments in pieces, the end markers and the stop token
            args = json.dumps({"query": "w" * 12, "limit": 3})
            pieces = [args[i : i + 6] for i in range(0, len(args), 6)]
            plan = [_Token("call_name", self.tool), *(_Token("call_args", p) for p in pieces), _Token("eos")]
            return out + plan[: max(0, n - len(out))]
        out += [_Token("content", _WORDS[i % 97]) for i in range(n - len(out))]
        return out

    def _steps(self) -> list[_Step]:
        pattern = self.cfg.chunk_pattern or [max(1, self.cfg.tokens_per_chunk)]
        steps, i, cyc = [], 0, itertools.cycle(pattern)
        while i < len(self.tokens):
            k = max(1, next(cyc))  # a pattern starting with 1 imitates the prefill step's single token
            steps.append(_step(self.tokens[i : i + k]))
            i += k
        return steps

    def _usage(self, done: int, reasoning: int) -> dict[str, Any]:
        """UsageInfo.model_dump() of SGLang: every field, null where unset."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + done,
            "completion_tokens": done,
            "prompt_tokens_details": {"cached_tokens": self.cached} if self.cfg.enable_cache_report else None,
            "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
        }

    def _spec(self) -> dict[str, Any]:
        verify = len(self._steps())
        return {"spec_verify_ct": verify, "spec_accept_length": len(self.tokens) / max(1, verify)}

    def full(self, headers: dict[str, str]) -> web.Response:
        reasoning = "".join(t.text for t in self.tokens if t.kind == "reasoning")
        content = "".join(t.text for t in self.tokens if t.kind == "content")
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish}
        if self.chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content or None,
                "reasoning_content": reasoning or None,
            }
            if not self.separate and reasoning:
                message = {"role": "assistant", "content": f"<think>{reasoning}</think>{content}"}
            if self.tool:
                args = "".join(t.text for t in self.tokens if t.kind == "call_args")
                message["tool_calls"] = [
                    {
                        "id": f"functions.{self.tool}:0",
                        "index": 0,
                        "type": "function",
                        "function": {"name": self.tool, "arguments": args},
                    }
                ]
            choice["message"] = message
        else:
            choice["text"] = content
        out: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(len(self.tokens), self.reasoning_total),
        }
        if self.cfg.speculative and self.body.get("return_spec_tokens_details"):
            out["sglext"] = {"spec_tokens_details": self._spec()}
        self.server.stats.tokens += len(self.tokens)
        self.server.stats.chunks += 1
        return web.Response(body=_enc.encode(out), content_type="application/json", headers=headers)

    def _frame(self, choices: list[Any], **extra: Any) -> bytes:
        chunk = {"id": self.rid, "object": self.obj, "created": self.created, "model": self.model, "choices": choices}
        if extra:
            chunk.update(extra)
        return b"data: " + _enc.encode(chunk) + b"\n\n"

    def _chat_frames(self, step: _Step, first: bool, usage: dict[str, Any] | None) -> list[bytes]:
        """The frames of one step, in serving_chat.py's order and shapes."""
        out = []
        extra = {"usage": usage} if usage is not None else {}
        if first:
            out.append(self._frame([_choice({"reasoning_content": None, "role": "assistant", "content": ""})]))
        reasoning, content = step.reasoning, step.content
        if reasoning and self.separate:
            out.append(self._frame([_choice({"reasoning_content": reasoning})], **extra))
        elif reasoning:
            content = reasoning + content
        if self.tool is None:
            if content:
                out.append(self._frame([_choice({"reasoning_content": None, "content": content})], **extra))
            return out
        for t in step.calls:  # the tool-call path: pydantic-dumped chunks (serving_chat._process_tool_call_stream)
            if t.kind == "call_name":
                call = {
                    "id": f"functions.{t.text}:0",
                    "index": 0,
                    "type": "function",
                    "function": {"name": t.text, "arguments": ""},
                }
            else:
                call = {"id": None, "index": 0, "type": "function", "function": {"name": None, "arguments": t.text}}
            delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": [call]}
            out.append(self._frame([_choice(delta)], usage=usage))
        return out

    async def stream(self, request: web.Request, headers: dict[str, str], fail: bool) -> web.StreamResponse:
        cfg, st = self.cfg, self.server.stats
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
        await resp.prepare(request)
        opts = self.body.get("stream_options") or {}
        want_usage = bool(opts.get("include_usage"))
        continuous = cfg.continuous_usage or bool(opts.get("continuous_usage_stats"))
        log = StepLog(self.rid) if cfg.log_steps else None
        t0 = time.perf_counter()
        done = reasoning = chunks = 0
        steps = self._steps()
        for i, step in enumerate(steps):
            done += step.tokens
            reasoning += step.reasoning_tokens
            usage = self._usage(done, reasoning) if continuous else None
            if self.chat:
                frames = self._chat_frames(step, i == 0, usage)
                n_out = len(frames) - (1 if i == 0 else 0)  # the role chunk carries no output
            else:
                last = i == len(steps) - 1
                text = step.content
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": self.finish if last else None,
                    "matched_stop": None,
                }
                frames = [self._frame([choice], usage=usage)]
                n_out = int(bool(text))
            if frames:
                await resp.write(b"".join(frames))
            if log is not None:
                log.times.append(time.perf_counter() - t0)
                log.tokens.append(done)
                log.chunks.append(n_out)
            chunks += n_out
            st.chunks += n_out
            if fail and chunks >= cfg.error_after_chunks:
                err = {"error": {"message": "injected failure", "type": "InternalServerError", "code": 500}}
                await resp.write(b"data: " + _enc.encode(err) + b"\n\ndata: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if cfg.chunk_delay and i + 1 < len(steps):
                await asyncio.sleep(cfg.chunk_delay)
        tail = []
        if self.chat:
            fin = _choice(
                {"reasoning_content": None},
                finish_reason=self.finish,
                matched_stop=EOS_ID if self.finish in ("stop", "tool_calls") else None,
            )
            tail.append(self._frame([fin]))
        if cfg.speculative and self.body.get("return_spec_tokens_details"):
            tail.append(self._frame([], usage=None, sglext={"spec_tokens_details": self._spec()}))
        if want_usage:
            tail.append(self._frame([], usage=self._usage(done, reasoning)))
        tail.append(b"data: [DONE]\n\n")
        await resp.write(b"".join(tail))
        await resp.write_eof()
        st.tokens += done
        if log is not None:
            self.server.steps.append(log)
        return resp


def _step(tokens: list[_Token]) -> _Step:
    reasoning, content, calls, n_reasoning = [], [], [], 0
    for t in tokens:
        kind = t.kind
        if kind == "content":
            content.append(t.text)
        elif kind == "reasoning":
            reasoning.append(t.text)
            n_reasoning += 1
        elif kind == "think_end":
            n_reasoning += 1
        elif kind != "eos":
            calls.append(t)
    return _Step(
        tokens=len(tokens),
        reasoning_tokens=n_reasoning,
        reasoning="".join(reasoning),
        content="".join(content),
        calls=calls,
    )


def _choice(
    delta: dict[str, Any], *, finish_reason: str | None = None, matched_stop: int | None = None
) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "matched_stop": matched_stop}


def _prompt_words(body: dict[str, Any]) -> tuple[str, ...]:
    """The prompt as words: a stand-in for tokens (role and content of every message, in order)."""
    if "messages" in body:
        words: list[str] = []
        for m in body["messages"] or ():
            if isinstance(m, dict):
                words.append(f"<{m.get('role')}>")
                content = m.get("content")
                words += str(content).split() if content else []
                if m.get("tool_calls"):
                    words += json.dumps(m["tool_calls"]).split()
        return tuple(words)
    return tuple(str(body.get("prompt", "")).split())


def _flat_error(status: int, message: str) -> web.Response:
    """SGLang's flat error shape on OpenAI routes."""
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}
    return web.Response(status=status, body=_enc.encode(body), content_type="application/json")


class RunningServer:
    """In-process server on a free loopback port, for tests: `async with RunningServer(cfg)`."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.server = TestServer(config)
        self._runner = web.AppRunner(self.server.app, access_log=None)
        self.url = ""

    @property
    def stats(self) -> Stats:
        return self.server.stats

    async def __aenter__(self) -> RunningServer:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


def _pattern(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("tokens per step must be >= 1")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.testserver", description="zero-delay SGLang-compatible server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--model", default="test-model")
    p.add_argument("--backend-name", default=None)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--chunk-pattern", type=_pattern, default=[], help="tokens per step, cycled, e.g. 1,4,2,6")
    p.add_argument("--speculative", action="store_true")
    p.add_argument("--chunk-delay", type=float, default=0.0)
    p.add_argument("--reasoning-tokens", type=int, default=0, help="thinking tokens before the answer (0: none)")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--log-steps", action="store_true", help="keep per-request step times (GET /steps)")
    p.add_argument("--api-key", default=None)
    a = p.parse_args(argv)
    cfg = ServerConfig(
        model=a.model,
        backend_name=a.backend_name,
        tokens_per_chunk=a.tokens_per_chunk,
        chunk_pattern=a.chunk_pattern,
        speculative=a.speculative,
        chunk_delay=a.chunk_delay,
        reasoning_tokens=a.reasoning_tokens,
        enable_cache_report=a.enable_cache_report,
        log_steps=a.log_steps,
        api_key=a.api_key,
    )
    try:
        import uvloop
    except ImportError:
        pass  # optional: asyncio's own loop
    else:
        uvloop.install()
    web.run_app(TestServer(cfg).app, host=a.host, port=a.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
