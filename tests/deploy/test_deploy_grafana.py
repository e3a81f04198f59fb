"""deploy/grafana/specroute.json, panel by panel, against what the gateway and the twins really export.

- Grafana's schema: the file is a fixed point of grafana-foundation-sdk's dashboard model (generated
  from Grafana's schema): a key it does not know would be dropped, an object of the wrong shape refused
  (the model does not check enum values or scalar types). And the file is what
  deploy/grafana/build_dashboard.py writes.
- Every metric a panel's query names, and every label it groups, filters or labels a legend by, is in
  the /metrics of a running gateway (after real traffic, one backend failing so that the error series
  exist) or of a twin run with --enable-metrics (the `sglang:` series of a real SGLang server).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import urllib.request
from types import ModuleType

import pytest

from tests.support import REPO, gateway

DASHBOARD = REPO / "deploy" / "grafana" / "specroute.json"

# PromQL words that are not metric names: functions are followed by "(", these are not always.
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "le",
    "inf",
    "nan",
}


def _builder() -> ModuleType:
    path = REPO / "deploy" / "grafana" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("deploy_grafana_build_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def parse_promql(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses. Enough PromQL for the dashboard's queries."""
    labels: set[str] = set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors [5m] / [$__rate_interval]
    for body in re.findall(r"\{([^}]*)\}", text):  # label matchers
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for body in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels |= {w.strip() for w in body.split(",") if w.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    names = {
        m.group(1)
        for m in re.finditer(r"(?<![\w$:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", text)
        if m.group(1).lower() not in KEYWORDS
    }
    return names, labels - {"le"} | ({"le"} if "_bucket" in expr else set())


def test_promql_parser_finds_names_and_labels():
    names, labels = parse_promql(
        'histogram_quantile(0.9, sum by (le, backend) (rate(x_bucket{backend=~"$b", '
        'state="open"}[$__rate_interval]))) / scalar(sum (y_total)) + on (k) z'
    )
    assert names == {"x_bucket", "y_total", "z"}
    assert labels == {"le", "backend", "state", "k"}


def test_dashboard_is_valid_against_grafanas_schema():
    pytest.importorskip("grafana_foundation_sdk", reason="dev extra grafana-foundation-sdk holds Grafana's schema")
    builder = _builder()
    doc = json.loads(DASHBOARD.read_text())
    assert builder.normalized(doc) == doc  # nothing dropped, nothing invalid
    assert builder.render() == DASHBOARD.read_text(), "stale: run deploy/grafana/build_dashboard.py"
    # ...and the round trip does look: an unknown key is dropped, an object of the wrong shape refused.
    broken = json.loads(DASHBOARD.read_text())
    broken["panels"][1]["gridPoz"] = {}
    broken["panels"][2]["fieldConfig"]["defaults"]["colour"] = "red"
    assert builder.dropped(broken, builder.normalized(broken)) == [
        "/panels[1]/gridPoz",
        "/panels[2]/fieldConfig/defaults/colour",
    ]
    broken = json.loads(DASHBOARD.read_text())
    broken["panels"][1]["gridPos"] = "full width"
    with pytest.raises((TypeError, AttributeError)):
        builder.normalized(broken)


def test_dashboard_covers_what_the_issue_asks_for():
    queries = " ".join(t["expr"] for p in _panels() for t in p["targets"])
    for metric in (
        "specroute_decode_tokens_per_second",
        "specroute_accept_length",
        "specroute_speedup",
        "specroute_inflight",
        "specroute_ttft_seconds",
        "specroute_time_per_output_token_seconds",
        "specroute_upstream_errors_total",
        "specroute_policy_decisions_total",
        "specroute_queue_waiting",
        "specroute_admission_rejected_total",
        "gen_ai_server_time_to_first_token_seconds",
        "specroute_http_refused_total",
        "specroute_config_info",
        "specroute_build_info",
    ):
        assert metric in queries, metric
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))
    for p in _panels():  # on the 24-column grid, inside the dashboard
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["w"] > 0 and pos["h"] > 0, p["title"]


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created", ""),
}


def _exported(text: str) -> dict[str, set[str] | None]:
    """Sample name -> label names, from Prometheus text exposition. A labelled family with no series yet
    (declared by its # TYPE line only) maps its sample names to None: exported, labels unknown."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            out.setdefault(family.name + suffix, None)
        for sample in family.samples:
            out[sample.name] = (out.get(sample.name) or set()) | set(sample.labels)
    return out


def _scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return r.read().decode()


def test_every_panel_query_names_metrics_the_gateway_exports(tmp_path, twin_factory):
    good = twin_factory("k26-eagle3", "--enable-metrics")
    failing = twin_factory("k26-ar", "--fault-error-rate", "1.0", "--fault-error-status", "502")
    backends = [
        {"name": "k26-eagle3", "url": good, "model": "kimi-k2.6", "strategy": "eagle3"},
        {"name": "k26-ar", "url": failing, "model": "kimi-k2.6", "strategy": "ar"},
    ]
    openai = pytest.importorskip("openai")
    with gateway(tmp_path, backends, gateway_keys='policy = "round_robin"\n') as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        for i in range(4):
            stream = client.chat.completions.create(
                model="kimi-k2.6",
                max_tokens=16,
                stream=True,
                messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        exported = _exported(_scrape(url))
    exported.update(_exported(_scrape(good)))
    assert exported.get("specroute_upstream_errors_total")  # series, not only declared: the failing backend failed
    variables = tuple(json.loads(DASHBOARD.read_text())["templating"]["list"])
    assert _problems(_panels(), exported, variables) == []
    # ...and it does look: a misspelt metric and a label the metric does not have are both reported.
    bad = [
        {
            "title": "bad",
            "targets": [
                {"expr": "sum by (kind) (specroute_inflight)", "legendFormat": ""},
                {"expr": "rate(specroute_request_total[5m])", "legendFormat": ""},
            ],
        }
    ]
    assert _problems(bad, exported) == [
        "bad: specroute_inflight has no label(s) ['kind']",
        "bad: specroute_request_total is not exported",
    ]


def _problems(panels: list[dict], exported: dict[str, set[str] | None], variables: tuple[dict, ...] = ()) -> list[str]:
    """What the panels' queries (and the template variables' label_values) name that is not exported."""
    problems = []
    for panel in panels:
        for target in panel["targets"]:
            names, labels = parse_promql(target["expr"])
            labels |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            assert names, (panel["title"], target["expr"])
            for name in names:
                if name not in exported:
                    problems.append(f"{panel['title']}: {name} is not exported")
                    continue
                known = exported[name]
                if known is None:  # declared, no series in this run (e.g. no telemetry was skipped)
                    continue
                missing = labels - known - {"instance", "job"}  # the two Prometheus adds
                if missing:
                    problems.append(f"{panel['title']}: {name} has no label(s) {sorted(missing)}")
    for variable in variables:
        query = variable.get("query")
        if isinstance(query, dict):
            metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query["query"]).groups()
            if label not in (exported.get(metric) or set()):
                problems.append(f"variable {variable['name']}: {metric} has no label {label}")
    return problems
