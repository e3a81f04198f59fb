"""gateway/head_write.py: a response head leaves with the write after it, or alone at the end of the
event loop's pass; nothing else is held. Then the real thing: uvicorn with the protocol, one
non-streamed answer read back byte for byte over a socket."""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn
import uvloop

from gateway.head_write import HeadHoldingProtocol, HeadHoldingTransport
from tools.processes import free_port, wait_ready


class _Recorder:
    """Stands in for the socket transport: every write() it gets, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default


def _run(steps) -> _Recorder:
    async def scenario() -> _Recorder:
        rec = _Recorder()
        transport = HeadHoldingTransport(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
        await steps(transport, rec)
        return rec

    return asyncio.run(scenario())


def test_a_head_leaves_with_the_body_as_one_write():
    async def steps(t, rec):
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert rec.writes == []  # held
        t.write(b"{}")
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n")
        t.write(memoryview(b"x"))
        await asyncio.sleep(0)

    rec = _run(steps)
    assert rec.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx",
    ]


def test_a_head_with_nothing_after_it_leaves_at_the_end_of_the_pass_and_chunks_go_straight_through():
    async def steps(t, rec):
        t.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(0)  # one pass of the loop: the stream's first chunk is not there yet
        assert rec.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
        t.write(b"5\r\nhello\r\n")
        t.write(b"0\r\n\r\n")
        assert len(rec.writes) == 3  # not held
        await asyncio.sleep(0)

    assert len(_run(steps).writes) == 3


def test_close_sends_a_held_head_first_and_a_closed_transport_gets_nothing_late():
    async def steps(t, rec):
        t.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        t.close()
        assert rec.writes == [b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"] and rec.closed
        rec.writes.clear()
        rec.closed = False
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        rec.closed = True  # the client went away before the end of the pass
        await asyncio.sleep(0)
        assert rec.writes == []
        assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else is the transport's

    _run(steps)


def test_uvicorn_with_the_protocol_serves_whole_answers():
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await receive()
        stream = scope["path"] == "/stream"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")] + ([] if stream else [(b"content-length", b"5")]),
            }
        )
        if stream:
            for part in (b"he", b"llo"):
                await asyncio.sleep(0.01)
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": b"hello"})

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=HeadHoldingProtocol,
            loop="uvloop",
            log_level="warning",
            lifespan="on",
        )
    )
    # uvloop.run, not server.run: uvicorn < 0.36 makes uvloop every later asyncio.run's loop.
    thread = threading.Thread(target=lambda: uvloop.run(server.serve()), daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/", timeout_s=20)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            for path in ("/", "/stream", "/"):  # keep-alive: one connection, answers in order
                sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
                data = b""
                end = b"hello" if path == "/" else b"0\r\n\r\n"
                while not data.endswith(end):
                    chunk = sock.recv(65536)
                    assert chunk, data
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK")
                assert body == (b"hello" if path == "/" else b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n")
    finally:
        server.should_exit = True
        thread.join(10)
