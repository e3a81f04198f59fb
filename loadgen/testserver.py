"""A zero-delay SGLang-compatible streaming server: loadgen's yardstick and test double.

It answers `/v1/chat/completions` and `/v1/completions` (streamed and not) in SGLang's chunk
order (role chunk, content deltas of `tokens_per_chunk` tokens, finish chunk, `sglext` chunk when
asked, usage chunk when asked, `[DONE]`), plus `/v1/models`, `/health`, `/ready` and the gateway's
`/admin/backends`. It counts what it did (`/stats`): requests, tokens, chunks and the peak number
of requests in flight, which is how tests prove the closed loop never overshoots and how the
self-benchmark checks loadgen's throughput against a server-side count.

    python -m loadgen.testserver --port 8123 [--tokens-per-chunk 4] [--chunk-delay 0]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time

import msgspec
from aiohttp import web

_enc = msgspec.json.Encoder()


class ServerConfig(msgspec.Struct, kw_only=True):
    model: str = "test-model"
    backend_name: str | None = None  # sent as x-specroute-backend when set
    tokens_per_chunk: int = 1  # > 1 imitates speculation: one chunk per verify step
    speculative: bool = False  # answer return_spec_tokens_details with sglext
    chunk_delay: float = 0.0  # seconds between content chunks (0: as fast as possible)
    api_key: str | None = None  # require this bearer token
    error_every: int = 0  # every Nth request fails mid-stream with data: {"error": ...}
    error_after_chunks: int = 2  # content chunks sent before that error
    http_error_every: int = 0  # every Nth request answers HTTP 503 in SGLang's flat shape
    hold_until_inflight: int = 0  # requests wait until this many are in flight (max 5 s)
    continuous_usage: bool = False  # usage on every chunk, as SGLang's continuous_usage_stats
    backends: list[dict] = []  # served at /admin/backends, as the gateway does


class Stats(msgspec.Struct):
    requests: int = 0
    inflight: int = 0
    max_inflight: int = 0
    tokens: int = 0  # completion tokens of finished requests
    chunks: int = 0  # content chunks written
    first_request: float | None = None  # time.time() of the first request
    last_end: float | None = None  # time.time() the last request finished


_WORDS = [f" w{i}" for i in range(97)]


class TestServer:
    """The aiohttp application plus its counters; `app` is ready to run."""

    __test__ = False  # not a pytest test class

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.stats = Stats()
        self._gate = asyncio.Event()
        self.app = web.Application()
        r = self.app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._ok)
        r.add_get("/ready", self._ok)
        r.add_get("/stats", self._stats)
        r.add_post("/stats/reset", self._reset)
        r.add_get("/admin/backends", self._backends)

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=_enc.encode(self.stats), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        self.stats = Stats()
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
        except msgspec.DecodeError:
            return _flat_error(400, "malformed JSON")
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
                try:
                    await asyncio.wait_for(self._gate.wait(), 5.0)
                except asyncio.TimeoutError:
                    pass
            if cfg.http_error_every and nth % cfg.http_error_every == 0:
                return _flat_error(503, "injected overload")
            n = int(body.get("max_tokens") or 16)
            prompt_tokens = _prompt_tokens(body)
            headers = {"x-specroute-backend": cfg.backend_name} if cfg.backend_name else {}
            if body.get("stream"):
                fail = bool(cfg.error_every and nth % cfg.error_every == 0)
                return await self._stream(request, body, chat, n, prompt_tokens, headers, fail)
            return self._full(body, chat, n, prompt_tokens, headers)
        finally:
            st.inflight -= 1
            st.last_end = time.time()

    def _full(self, body: dict, chat: bool, n: int, prompt_tokens: int, headers: dict[str, str]) -> web.Response:
        text = "".join(_WORDS[i % 97] for i in range(n))
        choice: dict = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        out: dict = {
            "id": "x",
            "object": "chat.completion" if chat else "text_completion",
            "model": body.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n},
        }
        if self.config.speculative and body.get("return_spec_tokens_details"):
            out["sglext"] = {"spec_tokens_details": self._spec(n)}
        self.stats.tokens += n
        self.stats.chunks += 1
        return web.Response(body=_enc.encode(out), content_type="application/json", headers=headers)

    def _spec(self, n: int) -> dict:
        verify = max(1, math.ceil(n / self.config.tokens_per_chunk))
        return {"spec_verify_ct": verify, "spec_accept_length": n / verify}

    async def _stream(
        self,
        request: web.Request,
        body: dict,
        chat: bool,
        n: int,
        prompt_tokens: int,
        headers: dict[str, str],
        fail: bool,
    ) -> web.StreamResponse:
        cfg = self.config
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
        await resp.prepare(request)
        model = body.get("model")
        obj = "chat.completion.chunk" if chat else "text_completion"
        want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        continuous = cfg.continuous_usage or bool((body.get("stream_options") or {}).get("continuous_usage_stats"))

        def frame(choices: list, **extra: object) -> bytes:
            return (
                b"data: "
                + _enc.encode({"id": "x", "object": obj, "model": model, "choices": choices, **extra})
                + b"\n\n"
            )

        def usage(done: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}

        if chat:
            await resp.write(
                frame([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            )
        sent = chunks = 0
        k = max(1, cfg.tokens_per_chunk)
        while sent < n:
            take = min(k, n - sent)
            text = "".join(_WORDS[(sent + j) % 97] for j in range(take))
            sent += take
            chunks += 1
            choice = (
                {"index": 0, "delta": {"content": text}, "finish_reason": None}
                if chat
                else {"index": 0, "text": text, "finish_reason": None}
            )
            extra = {"usage": usage(sent)} if continuous else {}
            await resp.write(frame([choice], **extra))
            self.stats.chunks += 1
            if fail and chunks >= cfg.error_after_chunks:
                err = {"error": {"message": "injected failure", "type": "InternalServerError", "code": 500}}
                await resp.write(b"data: " + _enc.encode(err) + b"\n\ndata: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if cfg.chunk_delay:
                await asyncio.sleep(cfg.chunk_delay)
        fin = (
            {"index": 0, "delta": {}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "length"}
        )
        await resp.write(frame([fin]))
        if cfg.speculative and body.get("return_spec_tokens_details"):
            await resp.write(frame([], sglext={"spec_tokens_details": self._spec(n)}))
        if want_usage:
            await resp.write(frame([], usage=usage(n)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.stats.tokens += n
        return resp


def _prompt_tokens(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    return len(str(body.get("prompt", "")).split())


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

    async def __aenter__(self) -> "RunningServer":
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadgen.testserver", description="zero-delay SGLang-compatible streaming server"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--model", default="test-model")
    p.add_argument("--backend-name", default=None)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--speculative", action="store_true")
    p.add_argument("--chunk-delay", type=float, default=0.0)
    p.add_argument("--api-key", default=None)
    a = p.parse_args(argv)
    cfg = ServerConfig(
        model=a.model,
        backend_name=a.backend_name,
        tokens_per_chunk=a.tokens_per_chunk,
        speculative=a.speculative,
        chunk_delay=a.chunk_delay,
        api_key=a.api_key,
    )
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    if uvloop is not None:
        uvloop.install()
    web.run_app(TestServer(cfg).app, host=a.host, port=a.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
