"""The span export pipeline as processes: the exporter process falling behind, shutting down,
outliving a group SIGTERM; and the trace context a real upstream receives (the context and
sampling rules themselves: tests/unit/test_tracing.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import openai
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.access_log import AccessLog
from gateway.config import TracingSection, config_from_dict
from gateway.records import RequestRecord, encode_request
from gateway.span_export import ProcessSink, SpanShipper
from gateway.tracing import Tracing
from tests.inprocess import serve_in_thread
from tests.support import free_port, wait_until
from tests.unit.test_tracing import PARENT, TRACE


class _Upstream:
    """A minimal SGLang-shaped upstream that records the trace headers it receives."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen: list[tuple[str | None, str | None]] = []
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        app = web.Application()

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        app.router.add_get("/ready", ok)
        app.router.add_get("/health", ok)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _chat(self, request: web.Request) -> web.Response:
        self.seen.append((request.headers.get("traceparent"), request.headers.get("tracestate")))
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def upstream():
    u = _Upstream()
    yield u
    u.close()


def _record(i: int, with_server_span: bool = False) -> tuple:
    """A `TraceRecord` as the request path ships it: a SERVER span and its CLIENT span, or (by
    default) one CLIENT span whose SERVER span was shipped before."""
    request = RequestRecord(
        request_id="r",
        model="m",
        kind="chat",
        stream=True,
        status=200,
        duration_s=0.1,
        speedup=1.5,
        finish_reason="stop",
        max_tokens=8,
    )
    client = ("%016x" % (i + 1), 1, 2, None, ("127.0.0.1", 30000), encode_request(request))
    if with_server_span:
        return ("%032x" % (i + 1), "%016x" % (i + 2), None, None, 1, 3, ("POST", "/v1/chat/completions", 200), [client])
    return ("%032x" % (i + 1), "%016x" % (i + 2), None, None, 0, 0, None, [client])


def test_upstream_gets_the_client_spans_traceparent_and_the_tracestate(upstream):
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    config = config_from_dict(
        {"backends": [{"name": "up", "url": f"http://127.0.0.1:{upstream.port}", "model": "m", "strategy": "ar"}]}
    )
    with serve_in_thread(config, tracing=tracing, access_log=AccessLog(False)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        sampled = client.chat.completions.with_raw_response.create(
            model="m",
            messages=msgs,
            max_tokens=1,
            extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "v=1"},
        )
        unsampled = client.chat.completions.with_raw_response.create(
            model="m", messages=msgs, max_tokens=1, extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-00"}
        )
        tracing.force_flush()
    # the trace-id header names a trace the collector has: only a recorded (sampled) one
    assert sampled.headers["x-specroute-trace-id"] == TRACE
    assert "x-specroute-trace-id" not in unsampled.headers
    spans = exporter.get_finished_spans()
    client_span = next(s for s in spans if s.kind is SpanKind.CLIENT)
    assert len([s for s in spans if s.kind is SpanKind.CLIENT]) == 1  # the unsampled request left no span
    assert upstream.seen[0] == (f"00-{TRACE}-{client_span.context.span_id:016x}-01", "v=1")
    assert client_span.context.trace_state.to_header() == "v=1"
    traceparent, _ = upstream.seen[1]  # sampled out: the context still travels, flagged not sampled
    assert traceparent.startswith(f"00-{TRACE}-") and traceparent.endswith("-00")


def test_a_stalled_exporter_process_costs_bounded_memory_and_counted_drops():
    sink = ProcessSink(TracingSection(exporter="console"), max_pending_bytes=256 << 10)
    shipper = SpanShipper(sink)
    os.kill(sink.pid, signal.SIGSTOP)  # the exporter stops reading: the pipe fills, then the buffer
    try:
        for i in range(50_000):
            shipper.add(_record(i, with_server_span=True))
        shipper.flush()
        assert sink.dropped > 0 and sink.dropped % 2 == 0  # spans counted: two per record
        assert sink._pending_bytes <= 256 << 10
    finally:
        os.kill(sink.pid, signal.SIGCONT)
        sink._proc.kill()
        sink._proc.wait(5)


def test_exporter_process_exports_what_is_left_at_shutdown(capfd):
    shipper = SpanShipper(ProcessSink(TracingSection(exporter="console")))
    for i in range(3):
        shipper.add(_record(i))  # fewer than a batch, no event loop: sent at once
    shipper.shutdown()
    out = capfd.readouterr().out
    assert out.count('"name": "chat m"') == 3 and '"specroute.speedup": 1.5' in out
    assert '"gen_ai.request.max_tokens": 8' in out and '"gen_ai.response.finish_reasons": [' in out


def test_exporter_process_outlives_a_group_sigterm_and_ends_at_eof():
    """The gateway's process group gets SIGTERM on shutdown: the exporter keeps going until the
    gateway closes the pipe (or dies, which closes it too), so the last spans are not lost."""
    sink = ProcessSink(TracingSection(exporter="console"))

    def ignores_sigterm() -> bool:  # its start-up done: SIGTERM in the kernel's ignored mask
        with open(f"/proc/{sink.pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
        return bool(mask & (1 << (signal.SIGTERM - 1)))

    assert wait_until(ignores_sigterm, timeout=30)
    os.kill(sink.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert sink._proc.poll() is None
    os.close(sink._fd)  # what the gateway's death does to the pipe
    assert sink._proc.wait(60) == 0
