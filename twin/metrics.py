"""`/metrics` in Prometheus text format with SGLang's `sglang:` names (only with --enable-metrics).

Written by hand (no prometheus_client dependency): a handful of gauges computed from the engine
at scrape time, counters from the engine's lifetime totals, and three latency histograms fed by
the request handlers. Durations are in simulated seconds (wall / time_scale), i.e. what the real
server would report.
"""

from __future__ import annotations

import bisect

from twin.engine import EngineStats

__all__ = ["Histogram", "Metrics"]

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    60.0,
    120.0,
)
_ITL_BUCKETS = (
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)


class Histogram:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    __slots__ = ("name", "help", "buckets", "counts", "sum", "count")

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.help = help
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: str) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        for le, c in zip(self.buckets, self.counts, strict=True):
            cum += c
            out.append(f'{self.name}_bucket{{{labels},le="{le}"}} {cum}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{self.name}_sum{{{labels}}} {self.sum}")
        out.append(f"{self.name}_count{{{labels}}} {self.count}")
        return out


class Metrics:
    """The twin's metric families; `render` takes engine gauges at scrape time."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{model_name}"'
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _LATENCY_BUCKETS
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", _LATENCY_BUCKETS
        )
        self.requests_total = 0

    def render(self, stats: EngineStats, speculative: bool) -> str:
        lab = self.labels
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, value: float) -> None:
            lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}", f"{name}{{{lab}}} {float(value)}"])

        metric("sglang:num_running_reqs", "gauge", "The number of running requests.", stats.num_running)
        metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", stats.num_waiting)
        metric("sglang:num_used_tokens", "gauge", "The number of used tokens.", stats.num_used_tokens)
        metric("sglang:token_usage", "gauge", "The token usage.", stats.token_usage)
        metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", stats.gen_throughput)
        metric("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", stats.cache_hit_rate)
        if speculative:
            # the last 40-decode-step interval (metrics_reporter.py), not the lifetime average
            metric("sglang:spec_accept_length", "gauge", "The average acceptance length.", stats.accept_length)
            metric("sglang:spec_accept_rate", "gauge", "The average acceptance rate.", stats.accept_rate)
            metric(
                "sglang:spec_verify_calls_total",
                "counter",
                "The number of speculative verify calls.",
                stats.total_verify_ct,
            )
        metric(
            "sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", stats.total_prompt_tokens
        )
        metric(
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            stats.total_generated_tokens,
        )
        metric("sglang:num_requests_total", "counter", "Number of requests processed.", self.requests_total)
        for h in (self.ttft, self.itl, self.e2e):
            lines.extend(h.render(lab))
        return "\n".join(lines) + "\n"
