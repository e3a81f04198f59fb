"""Prometheus metrics at `/metrics`, with prometheus-client.

Why prometheus-client rather than the OpenTelemetry Prometheus exporter: it is the reference
implementation of the text format, its histogram observe is a lock and an add (no SDK metric
pipeline on the request path), and it needs no collection thread. Label sets are bounded: model,
backend, domain, endpoint, status, error type, policy and error kind only; never a per-request label.

Latency buckets reach past what the config lets a request take (`latency_buckets`): a p99 over a
histogram is clipped at its last finite bound, and a thinking answer of 4k tokens at 26 tok/s
takes about 157 s, so buckets that stopped at 10 s (TTFT) and 82 s (duration) showed every such
p99 as the bound. Every finished request is recorded, with its `error_type` when it failed.

Gauges that describe state (in-flight, health, circuit, queue, refusals at the door) are read at
scrape time by a custom collector, so the request path does not maintain them.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.config import Config
from gateway.records import RequestRecord

if TYPE_CHECKING:
    from gateway.admission import Admission
    from gateway.pool import Pools
    from gateway.refusals import Refusals

# Bucket boundaries from the OpenTelemetry GenAI semantic conventions.
GENAI_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
GENAI_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
GENAI_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
GENAI_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
QUEUE = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
DECODE_TOK_S = (5, 10, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000)
ACCEPT = (1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 10, 12, 16)
SPEEDUP = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
# The shortest a request's duration buckets reach: a stream has no overall timeout (idle_stream_s
# bounds its silences only), and a 16k-token thinking answer at K2.6's 26 tok/s takes 630 s.
MIN_DURATION_REACH_S = 900.0
# The `endpoint` label of each request kind (the route's last segment).
ENDPOINTS = {"chat": "chat", "completion": "completions", "responses": "responses"}
# error_type label values: the OpenAI error type a failed request got (the gateway's own, or what an
# upstream said), or the failure's kind. At most this many distinct values, then `_OTHER` (as the
# OpenTelemetry conventions name an unknown error.type), so an upstream cannot grow the label set.
MAX_ERROR_TYPES = 32
OTHER_ERROR = "_OTHER"
_ERROR_TYPE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class LatencyBuckets(NamedTuple):
    ttft: tuple[float, ...]
    duration: tuple[float, ...]
    queue: tuple[float, ...]


def reaching(bounds: tuple[float, ...], reach: float) -> tuple[float, ...]:
    """`bounds`, continued by doubling its last bound until one is at least `reach`."""
    out = list(bounds)
    while out[-1] < reach:
        out.append(round(out[-1] * 2, 6))
    return tuple(out)


def latency_buckets(config: Config) -> LatencyBuckets:
    """The latency histograms' bounds for `config`: the GenAI conventions' bounds, continued (by
    doubling) past the longest latency the timeouts allow, or `[metrics]`'s own when set.

    - TTFT: a stream's first token may take `first_byte_s` after `queue_timeout_s` in the queue.
    - Duration: a non-streamed answer may take `request_s`, a stream its TTFT and then as long as
      it keeps sending; at least MIN_DURATION_REACH_S.
    - Queue: up to `queue_timeout_s`."""
    t, a, m = config.timeouts, config.admission, config.metrics
    first_token = t.first_byte_s + a.queue_timeout_s
    return LatencyBuckets(
        ttft=tuple(m.ttft_buckets_s) or reaching(GENAI_TTFT, first_token),
        duration=tuple(m.duration_buckets_s)
        or reaching(GENAI_DURATION, max(t.request_s, first_token, MIN_DURATION_REACH_S)),
        queue=reaching(QUEUE, a.queue_timeout_s),
    )


def build_labels() -> tuple[str, str]:
    """(version, python): the installed specroute's version and the interpreter's."""
    try:
        version = importlib.metadata.version("specroute")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "unknown"
    return version, platform.python_version()


class GatewayMetrics:
    def __init__(self, buckets: LatencyBuckets | None = None) -> None:
        """`buckets`: the latency bounds (`latency_buckets`; None: a default config's)."""
        self.buckets = buckets = buckets or latency_buckets(Config())
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "specroute_requests",
            "Requests finished, by model, backend, endpoint, HTTP status and error type ('' when none).",
            ["model", "backend", "endpoint", "status", "error_type"],
            registry=r,
        )
        self.queue = Histogram(
            "specroute_queue_seconds",
            "Time spent waiting for capacity (admission).",
            ["model"],
            buckets=buckets.queue,
            registry=r,
        )
        self.ttft = Histogram(
            "specroute_ttft_seconds",
            "Time to first token through the gateway.",
            ["backend", "endpoint"],
            buckets=buckets.ttft,
            registry=r,
        )
        self.duration = Histogram(
            "specroute_request_duration_seconds",
            "End-to-end request duration, of every finished request; error_type '' when it succeeded.",
            ["backend", "endpoint", "error_type"],
            buckets=buckets.duration,
            registry=r,
        )
        self.tpot = Histogram(
            "specroute_time_per_output_token_seconds",
            "(e2e - ttft) / (output tokens - 1).",
            ["backend"],
            buckets=GENAI_TPOT,
            registry=r,
        )
        self.decode = Histogram(
            "specroute_decode_tokens_per_second",
            "Per-request decode speed.",
            ["backend", "domain"],
            buckets=DECODE_TOK_S,
            registry=r,
        )
        self.accept = Histogram(
            "specroute_accept_length",
            "Per-request speculative acceptance length.",
            ["backend", "domain"],
            buckets=ACCEPT,
            registry=r,
        )
        self.speedup = Histogram(
            "specroute_speedup",
            "Per-request decode speed over the AR baseline.",
            ["backend", "domain"],
            buckets=SPEEDUP,
            registry=r,
        )
        self.upstream_errors = Counter(
            "specroute_upstream_errors", "Upstream failures, by kind.", ["backend", "kind"], registry=r
        )
        self.retries = Counter(
            "specroute_retries", "Attempts beyond the first (before the first byte).", ["model"], registry=r
        )
        self.decisions = Counter(
            "specroute_policy_decisions",
            "Routing decisions, by chosen backend.",
            ["model", "policy", "backend"],
            registry=r,
        )
        self.telemetry_skipped = Counter(
            "specroute_telemetry_skipped",
            "Finished requests whose upstream telemetry was missing or malformed.",
            ["backend"],
            registry=r,
        )
        self.genai_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "GenAI operation duration; error_type (error.type) '' when it succeeded.",
            ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_provider_name", "error_type"],
            buckets=buckets.duration,
            registry=r,
        )
        self.genai_tokens = Histogram(
            "gen_ai_client_token_usage",
            "GenAI tokens used, by type.",
            ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type"],
            buckets=GENAI_TOKENS,
            registry=r,
        )
        self.genai_ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "GenAI time to first token.",
            ["gen_ai_operation_name", "gen_ai_request_model"],
            buckets=buckets.ttft,
            registry=r,
        )
        self.genai_tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "GenAI time per output token.",
            ["gen_ai_operation_name", "gen_ai_request_model"],
            buckets=GENAI_TPOT,
            registry=r,
        )

        self._children: dict[tuple[Any, ...], Any] = {}
        self._error_types: set[str] = set()
        self._pools: Pools | None = None
        # The metrics labelled by backend (`forget_backend`).
        self._by_backend: list[Counter | Histogram] = [
            self.requests,
            self.ttft,
            self.duration,
            self.tpot,
            self.decode,
            self.accept,
            self.speedup,
            self.upstream_errors,
            self.decisions,
            self.telemetry_skipped,
        ]

    def watch(
        self,
        pools: Pools,
        admission: Admission,
        refusals: Refusals | None = None,
        state: Callable[[], Iterator[GaugeMetricFamily | CounterMetricFamily]] | None = None,
    ) -> None:
        """Read `pools`, `admission` and `refusals` at each scrape; `state`: more families, made then."""
        self._pools = pools
        self.registry.register(_StateCollector(pools, admission, refusals, state))

    def observe(self, rec: RequestRecord) -> None:
        c = self._child
        backend = rec.backend or "none"
        # A label is a served model, never whatever a client asked for: unknown names would add
        # series (and children here) without bound.
        model = rec.model if self._pools is None or rec.model in self._pools.by_model else "unknown"
        endpoint = ENDPOINTS.get(rec.kind, "other")
        failed = rec.error_type is not None or rec.status != 200
        error_type = self._error_type(rec.error_type or str(rec.status)) if failed else ""
        c(self.requests, model, backend, endpoint, str(rec.status), error_type).inc()
        if rec.queue_s:
            c(self.queue, model).observe(rec.queue_s)
        op = "text_completion" if rec.kind == "completion" else "chat"
        c(self.duration, backend, endpoint, error_type).observe(rec.duration_s)
        if model != "unknown":
            c(self.genai_duration, op, model, "sglang", error_type).observe(rec.duration_s)
        if rec.backend is None or rec.status != 200:
            return
        if rec.completion_tokens is not None:  # a stream cut before its usage: not known, so not 0
            c(self.genai_tokens, op, rec.model, "input").observe(rec.prompt_tokens or 0)
            c(self.genai_tokens, op, rec.model, "output").observe(rec.completion_tokens)
        if rec.ttft_s is not None:
            c(self.ttft, backend, endpoint).observe(rec.ttft_s)
            c(self.genai_ttft, op, rec.model).observe(rec.ttft_s)
        if rec.tpot_s is not None:
            c(self.tpot, backend).observe(rec.tpot_s)
            c(self.genai_tpot, op, rec.model).observe(rec.tpot_s)
        domain = rec.domain or "chat"
        if rec.decode_tok_s is not None:
            c(self.decode, backend, domain).observe(rec.decode_tok_s)
        if rec.accept_length is not None:
            c(self.accept, backend, domain).observe(rec.accept_length)
        if rec.speedup is not None:
            c(self.speedup, backend, domain).observe(rec.speedup)

    def _error_type(self, value: str) -> str:
        """`value` as a label: itself while it is one of the first MAX_ERROR_TYPES well-formed values."""
        if value in self._error_types:
            return value
        if len(self._error_types) < MAX_ERROR_TYPES and _ERROR_TYPE.fullmatch(value):
            self._error_types.add(value)
            return value
        return OTHER_ERROR

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: `labels()` takes a lock and validates its arguments,
        a dozen times per request otherwise. Children are created at first use, as before, and the
        key space is the metrics' own bounded label sets."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forget_backend(self, name: str) -> None:
        """A backend that left the pool takes its series with it: names come and go (admin API,
        reloads, a URL changed), and kept, they would grow /metrics with every backend ever added.
        Prometheus keeps what it scraped."""
        for metric in self._by_backend:
            metric.remove_by_labels({"backend": name})
        self._children = {key: child for key, child in self._children.items() if name not in key[1]}

    def decision(self, model: str, policy: str, backend: str) -> None:
        self._child(self.decisions, model, policy, backend).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(
        self,
        pools: Pools,
        admission: Admission,
        refusals: Refusals | None,
        state: Callable[[], Iterator[GaugeMetricFamily | CounterMetricFamily]] | None,
    ) -> None:
        self.pools = pools
        self.admission = admission
        self.refusals = refusals
        self.state = state
        version, python = build_labels()
        self.build = GaugeMetricFamily(
            "specroute_build_info", "The gateway's build: 1, with its version.", labels=["version", "python"]
        )
        self.build.add_metric([version, python], 1.0)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        inflight = GaugeMetricFamily(
            "specroute_inflight",
            "Sequences in flight per backend (this gateway): a request of n > 1 counts n.",
            labels=["backend"],
        )
        up = GaugeMetricFamily("specroute_backend_up", "1 when the backend takes new requests.", labels=["backend"])
        ready = GaugeMetricFamily(
            "specroute_backend_ready", "Readiness as seen by the health checks.", labels=["backend"]
        )
        circuit = GaugeMetricFamily(
            "specroute_circuit_state", "1 for the current circuit state.", labels=["backend", "state"]
        )
        reported = GaugeMetricFamily(
            "specroute_backend_reported_running", "Running requests the backend reports.", labels=["backend"]
        )
        for b in self.pools.by_name.values():
            inflight.add_metric([b.name], b.inflight)
            up.add_metric([b.name], 1.0 if b.up else 0.0)
            ready.add_metric([b.name], 1.0 if b.ready else 0.0)
            state = b.circuit.state.value
            for s in ("closed", "open", "half_open"):
                circuit.add_metric([b.name, s], 1.0 if s == state else 0.0)
            if b.load is not None and b.load.running is not None:
                reported.add_metric([b.name], b.load.running)
        yield inflight
        yield up
        yield ready
        yield circuit
        yield reported
        yield GaugeMetricFamily(
            "specroute_queue_waiting", "Requests waiting for capacity.", value=self.admission.waiting
        )
        yield GaugeMetricFamily(
            "specroute_gateway_inflight", "Requests in flight, all backends.", value=self.admission.inflight
        )
        yield CounterMetricFamily(
            "specroute_admission_rejected", "Requests refused with 429 by admission.", value=self.admission.rejected
        )
        yield self.build
        if self.refusals is not None:
            refused = CounterMetricFamily(
                "specroute_http_refused",
                "Requests and connections turned away at the door (keys, limits, headers, bodies), by reason.",
                labels=["reason", "status"],
            )
            for (reason, status), count in self.refusals.counts.items():
                refused.add_metric([reason, str(status)], count)
            yield refused
        if self.state is not None:
            yield from self.state()
