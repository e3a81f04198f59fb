"""Traces, metrics and the access log, checked on what the gateway really emits."""

from __future__ import annotations

import collections
import importlib.metadata
import json
import os
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from gateway.access_log import AccessLog
from gateway.config import Config, TracingSection, config_from_dict
from gateway.tracing import Tracing
from tests.inprocess import serve_in_thread
from tests.support import free_port, gateway, loadgen, output, running, specroute, wait_until

N = 200  # output tokens of the span test's requests
MATH = [{"role": "user", "content": "A shop sells 12 apples at $3 each. How much do 5 apples cost in total?"}]


def _config(twins: dict[str, tuple[str, str]], **sections) -> Config:
    backends = [{"name": n, "url": u, "model": "kimi-k2.6", "strategy": s} for n, (u, s) in twins.items()]
    return config_from_dict({"backends": backends, **sections})


@pytest.fixture(scope="module")
def k26(twin_factory):
    return {"k26-ar": (twin_factory("k26-ar"), "ar"), "k26-dflash": (twin_factory("k26-dflash"), "dflash")}


def test_spans_names_parentage_and_attributes(k26):
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    with serve_in_thread(_config(k26), tracing=tracing, access_log=AccessLog(False)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        # Long enough outputs that chunk timing noise on a busy machine stays small against decode time.
        for _ in range(3):  # AR requests teach the gateway the baseline the speedup is measured against
            list(client.chat.completions.create(model="kimi-k2.6@k26-ar", messages=MATH, max_tokens=N, stream=True))
        raw = client.chat.completions.with_raw_response.create(
            model="kimi-k2.6@k26-dflash",
            messages=MATH,
            max_tokens=N,
            stream=True,
            temperature=0.5,
            extra_headers={"traceparent": traceparent, "x-request-id": "req-123"},
        )
        chunks = list(raw.parse())
        headers = raw.headers
        tracing.force_flush()
    spans = exporter.get_finished_spans()
    clients = [s for s in spans if s.kind is SpanKind.CLIENT]
    servers = {s.context.span_id: s for s in spans if s.kind is SpanKind.SERVER}
    assert len(clients) == 4 and not any("send" in s.name or "receive" in s.name for s in spans)
    last = clients[-1]
    parent = servers[last.parent.span_id]  # CLIENT span is the child of the request's SERVER span
    assert parent.name.startswith("POST /v1/chat/completions")
    assert format(last.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # incoming traceparent honoured
    assert headers["x-request-id"] == "req-123"
    assert headers["x-specroute-trace-id"] == "0af7651916cd43dd8448eb211c80319c"
    a = dict(last.attributes)
    assert last.name == "chat kimi-k2.6"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "sglang"
    assert a["gen_ai.request.model"] == "kimi-k2.6" and a["gen_ai.request.max_tokens"] == N
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.finish_reasons"] == ("length",) and len(a["gen_ai.response.id"]) == 32
    assert a["gen_ai.response.model"] == "kimi-k2.6" and a["gen_ai.usage.output_tokens"] == N
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.response.time_to_first_chunk"] > 0
    assert a["server.address"] == "127.0.0.1" and isinstance(a["server.port"], int)
    assert a["specroute.backend"] == "k26-dflash" and a["specroute.strategy"] == "dflash"
    assert a["specroute.policy"] == "pinned" and a["specroute.domain"] == "math"
    assert a["specroute.inflight_at_dispatch"] == 1 and a["specroute.verify_count"] > 0
    assert a["specroute.accept_length"] == pytest.approx(N / a["specroute.verify_count"])
    assert a["specroute.decode_tok_s"] > 0 and a["specroute.baseline_tok_s"] > 0
    assert a["specroute.speedup"] == pytest.approx(a["specroute.decode_tok_s"] / a["specroute.baseline_tok_s"])
    # the twin's DFlash on math is several times faster than its AR: the speedup says so
    ar_speed = [dict(s.attributes)["specroute.decode_tok_s"] for s in clients[:3]]
    # No upper bound: the gateway times the chunks as it reads them, and a starved test process reads
    # a stream's tail in one burst (once measured 196x), so only the direction is asserted.
    assert a["specroute.speedup"] > 2.0
    assert a["specroute.baseline_tok_s"] == pytest.approx(sum(ar_speed) / 3, rel=0.5)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_parallel_samples_teach_the_acceptance_of_one_sequence(k26):
    """`n` > 1: SGLang sums completion tokens over the sequences and lists their verify counts;
    the acceptance length is the total over the summed passes, not over the first sequence's."""
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    with serve_in_thread(_config(k26), tracing=tracing, access_log=AccessLog(False)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        r = client.completions.create(
            model="kimi-k2.6@k26-dflash",
            prompt="Solve for x: 3x + 4 = 19. Show each step.",
            max_tokens=60,
            n=4,
            extra_body={"return_spec_tokens_details": True},
        )
        client.completions.create(model="kimi-k2.6@k26-dflash", prompt="And 2x = 8?", max_tokens=5)
        tracing.force_flush()
    assert len(r.choices) == 4 and r.usage.completion_tokens == 4 * 60
    verify = [d["spec_verify_ct"] for d in r.model_extra["sglext"]["spec_tokens_details"]]
    span, after = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    # in flight in sequences, as SGLang counts its running requests, and all four given back
    assert span.attributes["specroute.inflight_at_dispatch"] == 4
    assert after.attributes["specroute.inflight_at_dispatch"] == 1
    a = dict(span.attributes)
    assert a["gen_ai.request.choice.count"] == 4 and a["gen_ai.usage.output_tokens"] == 240
    assert a["specroute.verify_count"] == sum(verify)
    assert a["specroute.accept_length"] == pytest.approx(240 / sum(verify))
    assert a["specroute.accept_length"] < 8  # DFlash's block: the first sequence's passes alone would pass it


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_parallel_samples_streamed_are_measured_per_sequence(tmp_path, k26, kind):
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    log_fd = os.open(tmp_path / "access.log", os.O_WRONLY | os.O_CREAT)
    with serve_in_thread(_config(k26), tracing=tracing, access_log=AccessLog(True, fd=log_fd)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        args = dict(model="kimi-k2.6@k26-dflash", max_tokens=80, n=4, stream=True)
        spec = {"return_spec_tokens_details": True}
        if kind == "chat":
            body = {**spec, "chat_template_kwargs": {"thinking": False}}
            chunks = list(client.chat.completions.create(messages=MATH, extra_body=body, **args))
        else:
            prompt = "Solve for x: 3x + 4 = 19. Show each step."
            chunks = list(client.completions.create(prompt=prompt, extra_body=spec, **args))
        tracing.force_flush()
    texts = collections.defaultdict(str)
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += (choice.delta.content or "") if kind == "chat" else choice.text
    assert sorted(texts) == [0, 1, 2, 3] and all(texts.values())
    assert not any(c.usage for c in chunks)  # the gateway asked for usage; the client did not get it
    (tail,) = [c for c in chunks if not c.choices]  # the client asked for sglext: it gets it
    verify = [d["spec_verify_ct"] for d in tail.model_extra["sglext"]["spec_tokens_details"]]
    (span,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    a = dict(span.attributes)
    assert a["gen_ai.request.choice.count"] == 4 and a["gen_ai.usage.output_tokens"] == 320
    assert a["specroute.verify_count"] == sum(verify) and a["specroute.inflight_at_dispatch"] == 4
    assert a["specroute.accept_length"] == pytest.approx(320 / sum(verify)) and a["specroute.accept_length"] < 8
    os.close(log_fd)
    (rec,) = [json.loads(line) for line in (tmp_path / "access.log").read_text().splitlines()]
    # per sequence: one stream's 80 tokens over the decode span, not all 320
    assert rec["sequences"] == 4 and rec["decode_tok_s"] == pytest.approx(79 / rec["decode_s"])
    assert rec["tpot_s"] * 79 == pytest.approx(rec["duration_s"] - rec["ttft_s"])


def test_failed_attempt_is_an_error_span_and_the_retry_its_sibling(twin_factory):
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    good = twin_factory("k26-ar")
    bad = twin_factory("k26-ar", "--fault-error-rate", "1.0", "--fault-error-status", "502")
    twins = {"good": (good, "ar"), "bad": (bad, "ar")}
    with serve_in_thread(_config(twins), tracing=tracing, access_log=AccessLog(False)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        for _ in range(8):
            client.chat.completions.create(model="kimi-k2.6", messages=MATH, max_tokens=4)
        tracing.force_flush()
    spans = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    failed = [s for s in spans if not s.status.is_ok]
    assert failed, "the faulty backend must have been tried at least once"
    for f in failed:
        a = dict(f.attributes)
        assert a["specroute.backend"] == "bad" and a["error.type"].startswith("http_5")
        siblings = [s for s in spans if s.parent.span_id == f.parent.span_id and s is not f]
        assert any(dict(s.attributes)["specroute.attempt"] == a["specroute.attempt"] + 1 for s in siblings)


def test_a_stream_cut_before_its_usage_reports_no_token_counts_rather_than_zero(twin_factory):
    """The upstream sends usage only at a stream's end: one that broke before it has no known token
    counts, so its span and the token histograms leave them out instead of saying 0."""
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    crashy = twin_factory("k26-ar", "--fault-crash-after-tokens", "5")
    with serve_in_thread(_config({"crashy": (crashy, "ar")}), tracing=tracing, access_log=AccessLog(False)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model="kimi-k2.6", messages=MATH, max_tokens=50, stream=True))
        tracing.force_flush()
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    (span,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    a = dict(span.attributes)
    assert not span.status.is_ok and a["specroute.backend"] == "crashy"
    assert "gen_ai.usage.output_tokens" not in a and "gen_ai.usage.input_tokens" not in a
    counted = [x.value for x in families["gen_ai_client_token_usage"].samples if x.name.endswith("_count")]
    assert sum(counted) == 0
    requests = [x for x in families["specroute_requests"].samples if x.name == "specroute_requests_total"]
    assert [(x.labels["backend"], x.labels["status"], x.value) for x in requests] == [("crashy", "200", 1.0)]


class _OtlpReceiver(BaseHTTPRequestHandler):
    received: ClassVar[list[ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_otlp_http_export_over_the_wire(tmp_path, k26):
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}",
        "OTEL_SERVICE_NAME": "specroute-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    backends = [{"name": n, "url": u, "model": "kimi-k2.6", "strategy": s} for n, (u, s) in k26.items()]
    try:
        with gateway(tmp_path, backends, env=env) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            for _ in range(3):
                list(client.chat.completions.create(model="kimi-k2.6", messages=MATH, max_tokens=8, stream=True))
            assert wait_until(
                lambda: (
                    sum(
                        1
                        for r in _OtlpReceiver.received
                        for rs in r.resource_spans
                        for ss in rs.scope_spans
                        for s in ss.spans
                        if s.kind == 3
                    )
                    >= 3
                )
            )
    finally:
        receiver.shutdown()
    spans = [
        (rs, s) for r in _OtlpReceiver.received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]
    service = {a.value.string_value for rs, _ in spans for a in rs.resource.attributes if a.key == "service.name"}
    assert service == {"specroute-test"}
    client_spans = [s for _, s in spans if s.kind == 3]  # SPAN_KIND_CLIENT
    assert {s.name for s in client_spans} == {"chat kimi-k2.6"}
    keys = {a.key for s in client_spans for a in s.attributes}
    assert {"gen_ai.usage.output_tokens", "specroute.backend", "specroute.decode_tok_s"} <= keys


def test_unreachable_collector_costs_nothing_but_a_warning(tmp_path, k26):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    backends = [{"name": n, "url": u, "model": "kimi-k2.6", "strategy": s} for n, (u, s) in k26.items()]
    with gateway(tmp_path, backends, env=env) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        results = [client.chat.completions.create(model="kimi-k2.6", messages=MATH, max_tokens=4) for _ in range(10)]
    assert all(r.usage.completion_tokens == 4 for r in results)


def test_metrics_are_consistent_with_the_requests_sent(tmp_path, k26):
    backends = [{"name": n, "url": u, "model": "kimi-k2.6", "strategy": s} for n, (u, s) in k26.items()]
    with gateway(tmp_path, backends) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        for i in range(12):
            list(client.chat.completions.create(model="kimi-k2.6", messages=MATH, max_tokens=10, stream=i % 2 == 0))
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope", messages=MATH)
        with __import__("urllib.request").request.urlopen(f"{url}/metrics") as r:
            text = r.read().decode()
            content_type = r.headers["content-type"]
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format, said once
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {
        (s.labels["backend"], s.labels["status"]): s.value
        for s in families["specroute_requests"].samples
        if s.name == "specroute_requests_total"
    }
    assert sum(v for (b, st), v in requests.items() if st == "200") == 12
    assert requests[("none", "404")] == 1

    def count(family):
        return sum(s.value for s in families[family].samples if s.name.endswith("_count"))

    # every finished request has its duration, a failed one with its error type (the refusal's 404 too)
    durations = {
        (s.labels["backend"], s.labels["endpoint"], s.labels["error_type"]): s.value
        for s in families["specroute_request_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert sum(v for (_, endpoint, error), v in durations.items() if not error and endpoint == "chat") == 12
    assert durations[("none", "chat", "not_found_error")] == 1 and count("specroute_request_duration_seconds") == 13
    (build,) = families["specroute_build_info"].samples
    assert build.value == 1 and build.labels["version"] == importlib.metadata.version("specroute")
    assert count("specroute_ttft_seconds") == 6  # only streams show a first token
    assert count("gen_ai_client_token_usage") == 24  # input and output per request
    decisions = sum(s.value for s in families["specroute_policy_decisions"].samples if s.name.endswith("_total"))
    assert decisions == 12
    accept = [s for s in families["specroute_accept_length"].samples if s.name.endswith("_count")]
    assert {s.labels["backend"] for s in accept if s.value} <= {"k26-dflash"}
    inflight = {s.labels["backend"]: s.value for s in families["specroute_inflight"].samples}
    assert inflight == {"k26-ar": 0, "k26-dflash": 0}
    buckets = [
        s.labels["le"]
        for s in families["gen_ai_server_time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket")
    ]
    assert buckets[:3] == ["0.001", "0.005", "0.01"]  # the GenAI conventions' boundaries
    assert all(
        set(s.labels)
        <= {
            "model",
            "backend",
            "status",
            "domain",
            "policy",
            "kind",
            "state",
            "le",
            "gen_ai_operation_name",
            "gen_ai_request_model",
            "gen_ai_provider_name",
            "gen_ai_token_type",
            "endpoint",
            "error_type",
            "reason",  # refusals at the door
            "version",  # build info
            "python",
            "digest",  # the running config's
            "entry",  # a discover = "dns" entry
        }
        for f in families.values()
        for s in f.samples
    )
    # the latency buckets reach past what the default timeouts allow (300 s to the first byte after
    # 30 s queued; 900 s for a whole answer): a long answer lands in a finite bucket
    for family, reach in (("specroute_ttft_seconds", 330), ("specroute_request_duration_seconds", 900)):
        bounds = {float(s.labels["le"]) for s in families[family].samples if s.name.endswith("_bucket")}
        assert max(bounds - {float("inf")}) >= reach, family


def test_access_log_one_json_line_per_request_joinable_and_without_secrets(tmp_path, k26):
    backends = [{"name": n, "url": u, "model": "kimi-k2.6", "strategy": s} for n, (u, s) in k26.items()]
    port = free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{port}"\n[auth]\napi_keys = ["sk-secret-key"]\n'
        + "".join(
            f'[[backends]]\nname = "{b["name"]}"\nurl = "{b["url"]}"\nmodel = "{b["model"]}"\n'
            f'strategy = "{b["strategy"]}"\n'
            for b in backends
        )
    )
    with running(specroute("serve", "--config", str(cfg)), ready_url=f"http://127.0.0.1:{port}/health") as proc:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-secret-key", max_retries=0)
        ids = []
        for i in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model="kimi-k2.6", messages=MATH, max_tokens=6, stream=bool(i % 2), temperature=i / 2
            )
            ids.append(raw.headers["x-request-id"])
            raw.parse() if i % 2 == 0 else list(raw.parse())
        # the Responses API: routed on SGLang's budget (2 less), logged as asked
        client.responses.create(model="kimi-k2.6", input="Say hi.", max_output_tokens=9, store=False)

        def lines():
            return [json.loads(line) for line in output(proc).splitlines() if line.startswith('{"ts"')]

        assert wait_until(lambda: len(lines()) == 5)
        *log, responses = lines()
        text = output(proc)
    assert [r["request_id"] for r in log] == ids
    assert all(r["status"] == 200 and r["model"] == "kimi-k2.6" and r["completion_tokens"] == 6 for r in log)
    assert all(r["backend"] in k26 and r["policy"] and "duration_s" in r for r in log)
    assert [(r["max_tokens"], r["temperature"]) for r in log] == [(6, i / 2) for i in range(4)]  # as asked
    assert responses["kind"] == "responses" and responses["max_tokens"] == 9
    assert "sk-secret-key" not in text and "apples" not in text  # no key, no prompt text by default


def test_a_loadgen_run_gives_one_trace_per_request_joined_by_trace_id(tmp_path, k26):
    """The acceptance run: with OTEL_EXPORTER_OTLP_ENDPOINT set, `loadgen` through the gateway
    makes one trace per request (a SERVER span and its CLIENT span, the speedup among the CLIENT
    span's attributes), and loadgen's requests.jsonl joins to them by trace id."""

    class Receiver(_OtlpReceiver):
        received: ClassVar[list[ExportTraceServiceRequest]] = []

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    backends = [{"name": n, "url": u, "model": "kimi-k2.6", "strategy": s} for n, (u, s) in k26.items()]
    out = tmp_path / "run"
    try:
        with gateway(tmp_path, backends, env=env) as url:
            run = subprocess.run(
                loadgen(
                    "--target",
                    "gateway",
                    "--gateway-url",
                    url,
                    "--concurrency",
                    "4",
                    "--num-prompts",
                    "12",
                    "--max-tokens",
                    "16",
                    "--dataset",
                    "math",
                    "--output",
                    str(out),
                    "--no-plots",
                ),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, run.stderr
            rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
            traces = {r["trace_id"] for r in rows}

            def spans():
                return [
                    s for r in Receiver.received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
                ]

            assert wait_until(lambda: len(spans()) >= 2 * len(rows))
    finally:
        receiver.shutdown()
    assert len(rows) == 12 and all(r["ok"] for r in rows)
    assert len(traces) == 12 and all(len(t) == 32 for t in traces) and all(r["request_id"] for r in rows)
    by_trace: dict[str, list] = {}
    for s in spans():
        by_trace.setdefault(s.trace_id.hex(), []).append(s)
    generations = {t: ss for t, ss in by_trace.items() if any(s.name.startswith("POST ") for s in ss)}
    assert set(generations) == traces  # one trace per request, each found from loadgen's row
    # the rest: the GETs loadgen made to learn the model (one span each, no upstream call)
    assert all(len(ss) == 1 and ss[0].name.startswith("GET ") for t, ss in by_trace.items() if t not in traces)
    for trace in generations.values():
        server = [s for s in trace if s.kind == 2]  # SPAN_KIND_SERVER
        client = [s for s in trace if s.kind == 3]  # SPAN_KIND_CLIENT
        assert len(server) == 1 and len(client) == 1 and client[0].parent_span_id == server[0].span_id
        attrs = {a.key: a.value for a in client[0].attributes}
        assert attrs["specroute.speedup"].double_value > 0
        assert attrs["specroute.backend"].string_value in k26


def test_a_thinking_streams_client_span_times_its_first_reasoning_token(twin_factory):
    """The CLIENT span and the access log line carry the reasoning tokens, and the span's time to
    first chunk is the first reasoning token's (not the first answer token's)."""
    thinker = twin_factory("k26-dflash", "--reasoning-parser", "kimi_k2")
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingSection(), exporter=exporter)
    with serve_in_thread(
        _config({"k26-dflash": (thinker, "dflash")}), tracing=tracing, access_log=AccessLog(False)
    ) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="kimi-k2.6",
                messages=MATH,
                max_tokens=N,
                stream=True,
                extra_body={"chat_template_kwargs": {"thinking": True}},
            )
        )
        tracing.force_flush()
    reasoning = [c for c in chunks if c.choices and (c.choices[0].delta.model_extra or {}).get("reasoning_content")]
    assert reasoning, "the twin should have thought first"
    span = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT)
    a = dict(span.attributes)
    assert 0 < a["specroute.reasoning_tokens"] <= a["gen_ai.usage.output_tokens"] == N
    if a["specroute.reasoning_tokens"] < N:  # an answer followed: its first token came later
        assert a["specroute.ttft_answer_s"] > a["gen_ai.response.time_to_first_chunk"]
