"""A minimal zero-delay SGLang-compatible backend for the gateway benchmark.

Why not the twin or `loadgen.testserver`: both are aiohttp applications whose own per-request
work (routing, JSON encode per chunk) would cost as much CPU as the gateway being measured, and
they share a core with the load generator. This one is an asyncio `Protocol` with httptools'
parser and precomputed answers: a request costs a parse, a few byte searches and the writes.

What it answers:

- `POST /v1/chat/completions`: non-streaming, a fixed SGLang-shaped `chat.completion` with usage;
  streaming, SGLang's chunk order: role chunk, `--chunks` content chunks of one token each, the
  finish chunk, the usage chunk when `stream_options.include_usage` is set, `data: [DONE]`; every
  event is its own HTTP chunk and its own write, as SGLang sends them.
- `POST /v1/traces`: an OTLP/HTTP sink; accepts and discards (the tracing-on configuration).
- `POST /v1/completions`: the same answers (what a benchmark of the gateway's work needs).
- `GET /health`, `/ready`: 200. Everything else: 404 (the gateway's poller falls back quietly).

Optional pacing, read from the request body so the benchmark can vary it per request through
the gateway (which passes unknown fields through): `"bench_hold_ms": H` holds the answer (or the
first content chunk) for a time spread evenly over [0, 2H] ms, as a backend's service time;
`"bench_interval_ms": I` spaces the content chunks by I ms. The holds follow a golden-ratio
sequence rather than a random draw: they are as spread out (clients do not fall into lockstep)
but their quantiles settle within a few hundred requests, so direct and gateway runs see the same
service times and their difference is the gateway's, not sampling noise.

    python -m bench.zero_server --port 8199 [--chunks 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import httptools
import msgspec

_enc = msgspec.json.Encoder()


def _event(obj: dict) -> bytes:
    data = b"data: " + _enc.encode(obj) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _chunk_obj(delta: dict, finish: str | None) -> dict:
    # The field set SGLang 0.5.x writes on every chat chunk (nulls included): realistic byte sizes.
    return {
        "id": "5f2d7a0c9b1e4c3a8d6f0e1b2a3c4d5e",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
        "usage": None,
    }


class Answers:
    """Every byte the server sends, built once."""

    def __init__(self, chunks: int, split_writes: bool = False) -> None:
        self.chunks = chunks
        words = [f" w{i % 97}" for i in range(chunks)]
        text = "".join(words)
        usage = {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks}
        full = {
            "id": "5f2d7a0c9b1e4c3a8d6f0e1b2a3c4d5e",
            "object": "chat.completion",
            "created": 1767225600,
            "model": "bench-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None},
                    "logprobs": None,
                    "finish_reason": "length",
                    "matched_stop": None,
                }
            ],
            "usage": usage,
        }
        body = _enc.encode(full)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        # A non-streamed answer as one write, or (--split-writes) its head and its body as two, the way
        # an ASGI server sends http.response.start and http.response.body: `bench.split_writes`.
        self.full = [head, body] if split_writes else [head + body]
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        self.role = _event(_chunk_obj({"role": "assistant", "content": ""}, None))
        self.content = [
            _event(_chunk_obj({"role": None, "content": w, "reasoning_content": None, "tool_calls": None}, None))
            for w in words
        ]
        self.finish = _event(
            _chunk_obj({"role": None, "content": None, "reasoning_content": None, "tool_calls": None}, "length")
        )
        usage_chunk = {
            "id": "5f2d7a0c9b1e4c3a8d6f0e1b2a3c4d5e",
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "bench-model",
            "choices": [],
            "usage": usage,
        }
        self.usage = _event(usage_chunk)
        self.done = _event_raw(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        self.otlp = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        self.not_found = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def _event_raw(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stats:
    requests = 0
    chunks = 0
    holds = 0


_GOLDEN = 0.6180339887498949
_paced_tasks: set[asyncio.Future[None]] = set()


def _hold(mean_s: float) -> float:
    """The next service time of the even spread over [0, 2 * mean_s]."""
    Stats.holds += 1
    return 2 * mean_s * ((Stats.holds * _GOLDEN) % 1.0)


class ZeroProtocol(asyncio.Protocol):
    __slots__ = ("answers", "transport", "parser", "url", "body", "busy", "pending")

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.busy = False  # a paced answer is being written: later pipelined requests wait
        self.pending: list[tuple[bytes, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport is an asyncio.Transport; the Protocol signature says BaseTransport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()  # type: ignore[union-attr]  # data only arrives after connection_made

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, b"".join(self.body)
        if self.busy:
            self.pending.append((url, body))
        else:
            self._answer(url, body)

    def _answer(self, url: bytes, body: bytes) -> None:
        a, t = self.answers, self.transport
        assert t is not None
        if url in (b"/v1/chat/completions", b"/v1/completions"):  # the same canned answer for both
            Stats.requests += 1
            stream = b'"stream":true' in body
            if b'"bench_' in body:
                opts = msgspec.json.decode(body)
                hold = float(opts.get("bench_hold_ms") or 0) / 1000
                interval = float(opts.get("bench_interval_ms") or 0) / 1000
                if hold or interval:
                    self.busy = True
                    task = asyncio.ensure_future(self._paced(stream, b'"include_usage":true' in body, hold, interval))
                    _paced_tasks.add(task)  # held until done: the loop keeps only a weak reference
                    task.add_done_callback(_paced_tasks.discard)
                    return
            if not stream:
                for part in a.full:
                    t.write(part)
                return
            w = t.write
            w(a.stream_head)
            w(a.role)
            for c in a.content:
                w(c)
            w(a.finish)
            if b'"include_usage":true' in body:
                w(a.usage)
            w(a.done)
            Stats.chunks += a.chunks
        elif url == b"/v1/traces":
            t.write(a.otlp)
        elif url in (b"/health", b"/ready"):
            t.write(a.ok)
        elif url == b"/stats":
            data = _enc.encode({"requests": Stats.requests, "chunks": Stats.chunks})
            t.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)
            )
        else:
            t.write(a.not_found)

    async def _paced(self, stream: bool, include_usage: bool, hold: float, interval: float) -> None:
        a, t = self.answers, self.transport
        assert t is not None
        try:
            if not stream:
                if hold:
                    await asyncio.sleep(_hold(hold))
                for part in a.full:
                    t.write(part)
                return
            t.write(a.stream_head)
            t.write(a.role)
            if hold:
                await asyncio.sleep(_hold(hold))
            for i, c in enumerate(a.content):
                if i and interval:
                    await asyncio.sleep(interval)
                if t.is_closing():
                    return
                t.write(c)
            t.write(a.finish)
            if include_usage:
                t.write(a.usage)
            t.write(a.done)
            Stats.chunks += a.chunks
        finally:
            self.busy = False
            while self.pending and not self.busy:
                self._answer(*self.pending.pop(0))


async def serve(host: str, port: int, chunks: int, ready_fd: int | None = None, split_writes: bool = False) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers(chunks, split_writes)
    server = await loop.create_server(lambda: ZeroProtocol(answers), host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_fd is not None:
        os.write(ready_fd, b"%d\n" % server.sockets[0].getsockname()[1])
        os.close(ready_fd)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.zero_server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8199)
    p.add_argument("--chunks", type=int, default=64, help="content chunks per streamed answer")
    p.add_argument("--split-writes", action="store_true", help="a non-streamed answer's head and body in two writes")
    p.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    a = p.parse_args(argv)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    import uvloop

    uvloop.run(serve(a.host, a.port, a.chunks, split_writes=a.split_writes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
