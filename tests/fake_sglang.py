"""A fake SGLang server that logs every request it is sent, for the security tests: an attack must
leave no trace here but the gateway's own probes.

    python -m tests.fake_sglang --port P --log FILE [--prefix /p] [--model M] [--fail-on TEXT]
        [--stream-chunk-bytes N]

It answers what the gateway's poller reads (/ready, /health, /server_info, /v1/models, /v1/loads,
/health_generate, /metrics), chat and completions (non-streamed: a small answer; streamed: chunks
of `--stream-chunk-bytes` for as long as the client reads, so a client that stops reading fills
every buffer on the way), `GET /v1/responses/{id}` (404: it stores nothing) and 404 for the rest.
Every request is appended to the log as one JSON line: method, path (raw, as received), the
Authorization header, whether the body holds `--fail-on` (then it answers 500, as SGLang does
for a request whose handling raised), and, for streams, when its connection closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from aiohttp import web

PROBES = frozenset(
    {"/ready", "/health", "/server_info", "/get_server_info", "/v1/models", "/v1/loads", "/health_generate", "/metrics"}
)


def app(log: Path, prefix: str, model: str, fail_on: str | None, chunk_bytes: int) -> web.Application:
    def record(request: web.Request, **extra: object) -> None:
        entry = {
            "t": time.time(),
            "method": request.method,
            "path": request.raw_path,
            "authorization": request.headers.get("Authorization"),
            "via": request.headers.get("Via"),  # a gateway names itself there; the tests' own checks do not
            **extra,
        }
        with log.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.raw_path.split("?")[0]
        poisoned = fail_on is not None and fail_on.encode() in body
        record(request, poisoned=poisoned, bytes=len(body))
        if not path.startswith(prefix):
            return web.json_response({"object": "error", "message": "not found"}, status=404)
        path = path[len(prefix) :]
        if path in ("/ready", "/health", "/health_generate"):
            return web.Response(text="")
        if path in ("/server_info", "/get_server_info"):
            return web.json_response({"served_model_name": model, "max_running_requests": 64})
        if path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})
        if path == "/v1/loads":
            return web.json_response({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})
        if path == "/metrics":
            return web.Response(text="")
        if path in ("/v1/chat/completions", "/v1/completions") and request.method == "POST":
            if poisoned:
                return web.json_response(
                    {"object": "error", "message": "Internal server error", "type": "InternalServerError", "code": 500},
                    status=500,
                )
            request_body = json.loads(body)
            if request_body.get("stream"):
                return await stream(request, request_body)
            return web.json_response(answer(request_body))
        return web.json_response({"object": "error", "message": f"no route {path}", "code": 404}, status=404)

    def answer(body: dict) -> dict:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            "priority_seen": body.get("priority"),
        }

    async def stream(request: web.Request, body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        filler = "x" * chunk_bytes
        chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {"content": filler}, "finish_reason": None}],
        }
        data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
        try:
            while True:  # until the gateway closes the connection
                await response.write(data)
                await asyncio.sleep(0.001)
        except (ConnectionError, asyncio.CancelledError):
            record(request, closed=True)
            raise
        return response

    application = web.Application(client_max_size=1 << 30)
    application.router.add_route("*", "/{tail:.*}", handle)
    return application


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--prefix", default="")
    p.add_argument("--model", default="kimi-k2.6")
    p.add_argument("--fail-on", default=None)
    p.add_argument("--stream-chunk-bytes", type=int, default=64)
    a = p.parse_args()
    web.run_app(app(a.log, a.prefix, a.model, a.fail_on, a.stream_chunk_bytes), host="127.0.0.1", port=a.port)


if __name__ == "__main__":
    main()
