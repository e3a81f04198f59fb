#!/usr/bin/env python3
"""Writes deploy/grafana/specroute.json, the Grafana dashboard of the gateway's metrics.

    .venv/bin/python deploy/grafana/build_dashboard.py          # rewrite the JSON
    .venv/bin/python deploy/grafana/build_dashboard.py --check  # exit 1 if the JSON is out of date

The panels are plain dicts here; the output goes through grafana-foundation-sdk's dashboard model
(generated from Grafana's own schema), so a key the schema does not know would be dropped and a bad
enum value refused: tests/deploy/test_deploy_grafana.py checks that the committed file survives that round
trip unchanged, and that every metric a query names is one a running gateway (or twin) exports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("specroute.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
BACKEND = 'backend=~"$backend"'


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def _panel(
    pid: int,
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    pos: tuple[int, int, int, int],
    unit: str = "short",
    kind: str = "timeseries",
    min0: bool = True,
) -> dict[str, Any]:
    x, y, w, h = pos
    defaults: dict[str, Any] = {"unit": unit}
    if min0:
        defaults["min"] = 0
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def _row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
    }


def _mean(metric: str, by: str = "backend") -> str:
    """Mean per request over the window: rate of the histogram's sum over the rate of its count."""
    return (
        f"sum by ({by}) (rate({metric}_sum{{{BACKEND}}}[{RATE}]))"
        f" / sum by ({by}) (rate({metric}_count{{{BACKEND}}}[{RATE}]))"
    )


def _quantile(q: float, metric: str, by: str = "", selector: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({metric}_bucket{selector}[{RATE}])))"


def panels() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    y = 0

    def row(title: str) -> None:
        nonlocal y
        out.append(_row(len(out) + 1, title, y))
        y += 1

    def add(
        title: str, description: str, targets: list[tuple[str, str]], x: int, w: int, h: int = 8, **kw: Any
    ) -> None:
        out.append(_panel(len(out) + 1, title, description, targets, (x, y, w, h), **kw))

    row("Backends")
    add(
        "Decode tok/s per request, by backend",
        "Mean per-request decode speed (output tokens after the first "
        "over the decode time) of the requests that finished in the window.",
        [(_mean("specroute_decode_tokens_per_second"), "{{backend}}")],
        0,
        8,
    )
    add(
        "Accept length, by backend",
        "Mean per-request speculative acceptance length (tokens per verify step); 1 for autoregressive backends.",
        [(_mean("specroute_accept_length"), "{{backend}}")],
        8,
        8,
    )
    add(
        "Speedup over AR, by backend",
        "Mean per-request decode speed over the autoregressive baseline.",
        [(_mean("specroute_speedup"), "{{backend}}")],
        16,
        8,
    )
    y += 8
    add(
        "In flight, by backend",
        "Requests in flight from the gateways (summed over replicas) and the running "
        "requests each backend last reported.",
        [
            (f"sum by (backend) (specroute_inflight{{{BACKEND}}})", "{{backend}} from gateways"),
            (f"max by (backend) (specroute_backend_reported_running{{{BACKEND}}})", "{{backend}} reported running"),
        ],
        0,
        12,
    )
    add(
        "Backend up / circuit open",
        "1 when a backend takes new requests (min over replicas); circuit open (max over replicas).",
        [
            (f"min by (backend) (specroute_backend_up{{{BACKEND}}})", "{{backend}} up"),
            (f'max by (backend) (specroute_circuit_state{{{BACKEND}, state="open"}})', "{{backend}} circuit open"),
        ],
        12,
        12,
    )
    y += 8
    add(
        "SGLang servers: running and queued",
        "The backends' own gauges (SGLang --enable-metrics).",
        [
            ("sum by (instance) (sglang:num_running_reqs)", "{{instance}} running"),
            ("sum by (instance) (sglang:num_queue_reqs)", "{{instance}} queued"),
        ],
        0,
        12,
    )
    add(
        "SGLang servers: generation throughput",
        "Output tokens per second as each SGLang server reports it.",
        [("sum by (instance) (sglang:gen_throughput)", "{{instance}}")],
        12,
        12,
    )
    y += 8

    row("Latency")
    add(
        "TTFT percentiles",
        "Time to first token through the gateway, all backends.",
        [
            (_quantile(q, "specroute_ttft_seconds", selector=f"{{{BACKEND}}}"), f"p{int(q * 100)}")
            for q in (0.5, 0.9, 0.99)
        ],
        0,
        8,
        unit="s",
    )
    add(
        "TPOT percentiles",
        "Time per output token after the first, all backends.",
        [
            (_quantile(q, "specroute_time_per_output_token_seconds", selector=f"{{{BACKEND}}}"), f"p{int(q * 100)}")
            for q in (0.5, 0.9, 0.99)
        ],
        8,
        8,
        unit="s",
    )
    add(
        "TTFT p90, by backend",
        "Time to first token, 90th percentile per backend.",
        [(_quantile(0.9, "specroute_ttft_seconds", "backend", f"{{{BACKEND}}}"), "{{backend}}")],
        16,
        8,
        unit="s",
    )
    y += 8
    add(
        "Request duration percentiles",
        "End-to-end duration through the gateway of the requests answered without error. The buckets "
        "reach past the configured timeouts (a 150 s thinking answer lands in a finite bucket, so its "
        "p99 is not clipped at the last bound).",
        [
            (
                _quantile(q, "specroute_request_duration_seconds", selector=f'{{{BACKEND}, error_type=""}}'),
                f"p{int(q * 100)}",
            )
            for q in (0.5, 0.9, 0.99)
        ],
        0,
        8,
        unit="s",
    )
    add(
        "GenAI TTFT / TPOT p90, by model",
        "The OpenTelemetry GenAI semantic-convention histograms.",
        [
            (
                _quantile(0.9, "gen_ai_server_time_to_first_token_seconds", "gen_ai_request_model"),
                "TTFT {{gen_ai_request_model}}",
            ),
            (
                _quantile(0.9, "gen_ai_server_time_per_output_token_seconds", "gen_ai_request_model"),
                "TPOT {{gen_ai_request_model}}",
            ),
        ],
        8,
        8,
        unit="s",
    )
    add(
        "GenAI tokens/s, by type",
        "Input and output tokens per second (gen_ai.client.token.usage).",
        [(f"sum by (gen_ai_token_type) (rate(gen_ai_client_token_usage_sum[{RATE}]))", "{{gen_ai_token_type}}")],
        16,
        8,
    )
    y += 8

    row("Traffic and errors")
    add(
        "Requests/s, by endpoint and status",
        "Finished requests by endpoint (chat, completions, responses) and HTTP status.",
        [(f"sum by (endpoint, status) (rate(specroute_requests_total[{RATE}]))", "{{endpoint}} {{status}}")],
        0,
        8,
        unit="reqps",
    )
    add(
        "Errors/s, by error type",
        "Failed requests by the error type the client got (OpenAI's error types, or the failure's "
        "kind: broken_stream, client_disconnected...).",
        [(f'sum by (error_type) (rate(specroute_requests_total{{error_type!=""}}[{RATE}]))', "{{error_type}}")],
        8,
        8,
        unit="reqps",
    )
    add(
        "Refused at the door/s, by reason",
        "Requests and connections turned away before the request path: keys (401/403), rate limit (429), "
        "media type (415), connection cap (503), headers or body too slow (408), body too large (413).",
        [(f"sum by (reason) (rate(specroute_http_refused_total[{RATE}]))", "{{reason}}")],
        16,
        8,
        unit="reqps",
    )
    y += 8
    add(
        "Upstream errors/s, by kind",
        "Upstream failures by kind (connect, timeout, HTTP status, stream cut...).",
        [(f"sum by (kind) (rate(specroute_upstream_errors_total{{{BACKEND}}}[{RATE}]))", "{{kind}}")],
        0,
        8,
        unit="reqps",
    )
    add(
        "Retries and missing telemetry",
        "Attempts beyond the first (before the first byte), and finished "
        "requests whose upstream telemetry was missing.",
        [
            (f"sum (rate(specroute_retries_total[{RATE}]))", "retries"),
            (f"sum (rate(specroute_telemetry_skipped_total{{{BACKEND}}}[{RATE}]))", "telemetry skipped"),
        ],
        8,
        8,
        unit="reqps",
    )
    add(
        "Replicas by config and version",
        "Gateway replicas per running config digest and per build: more than one config line means a "
        "change has not reached every replica (or a replica refused the file: config file applied = 0).",
        [
            ("count by (digest) (specroute_config_info)", "config {{digest}}"),
            ("count by (version) (specroute_build_info)", "version {{version}}"),
            ("count (specroute_config_file_applied == 0)", "config file refused"),
        ],
        16,
        8,
    )
    y += 8

    row("Policy")
    add(
        "Policy decisions/s, by backend",
        "Routing decisions by chosen backend and policy.",
        [
            (
                f"sum by (policy, backend) (rate(specroute_policy_decisions_total{{{BACKEND}}}[{RATE}]))",
                "{{policy}} -> {{backend}}",
            )
        ],
        0,
        12,
        unit="reqps",
    )
    add(
        "Decision share, by backend",
        "Share of the routing decisions each backend gets.",
        [
            (
                f"sum by (backend) (rate(specroute_policy_decisions_total{{{BACKEND}}}[{RATE}]))"
                f" / scalar(sum (rate(specroute_policy_decisions_total[{RATE}])))",
                "{{backend}}",
            )
        ],
        12,
        12,
        unit="percentunit",
    )
    y += 8

    row("Admission")
    add(
        "Queue and gateway in flight",
        "Requests waiting for capacity, and in flight, summed over replicas.",
        [("sum (specroute_queue_waiting)", "waiting"), ("sum (specroute_gateway_inflight)", "in flight")],
        0,
        8,
    )
    add(
        "Queue wait p90",
        "Time spent waiting for capacity (admission), 90th percentile.",
        [(_quantile(0.9, "specroute_queue_seconds"), "p90")],
        8,
        8,
        unit="s",
    )
    add(
        "Rejections/s",
        "Requests refused with 429 by admission (queue full or queue timeout).",
        [(f"sum (rate(specroute_admission_rejected_total[{RATE}]))", "rejected")],
        16,
        8,
        unit="reqps",
    )
    return out


def dashboard() -> dict[str, Any]:
    return {
        "uid": "specroute-gateway",
        "title": "specroute gateway",
        "tags": ["specroute", "sglang", "llm"],
        "description": "Speculative-decoding-aware gateway: per-backend speed, acceptance and load; latency "
        "percentiles; errors; policy decisions; admission.",
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 41,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "hide": 0,
                    "skipUrlSync": False,
                },
                {
                    "name": "backend",
                    "label": "Backend",
                    "type": "query",
                    "datasource": DS,
                    "query": {"query": "label_values(specroute_inflight, backend)", "refId": "backend"},
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "hide": 0,
                    "skipUrlSync": False,
                    "sort": 1,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels(),
    }


def normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as Grafana's schema sees it: through grafana-foundation-sdk's model and back to JSON."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    out: dict[str, Any] = json.loads(json.dumps(Dashboard.from_json(doc), cls=JSONEncoder))
    return out


def dropped(before: Any, after: Any, path: str = "") -> list[str]:
    """Paths in `before` that the schema round trip lost or changed (defaults it adds are fine)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            p
            for k, v in before.items()
            for p in ([f"{path}/{k}"] if k not in after else dropped(v, after[k], f"{path}/{k}"))
        ]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [p for i, (b, a) in enumerate(zip(before, after, strict=True)) for p in dropped(b, a, f"{path}[{i}]")]
    return [] if before == after else [path]


def render() -> str:
    doc = dashboard()
    out = normalized(doc)
    lost = dropped(doc, out)
    if lost:
        raise ValueError(f"Grafana's dashboard schema does not keep: {', '.join(lost)}")
    return json.dumps(out, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write (or --check) deploy/grafana/specroute.json.")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
