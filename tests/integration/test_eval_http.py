"""`evaluate.http_check`: the virtual-clock evaluation cross-checked over real HTTP.

The definitions are checked without processes (HTTP-side figures from loadgen's request records
equal the harness's figures on the same requests; the generated gateway config is valid; the
comparison flags a disagreement). One reduced run goes end to end: four twins, a gateway per
policy, loadgen, in well under a minute. The 10% agreement is the benchmark's verdict
(`python -m evaluate.http_check`), not asserted here: at this size one exploratory request
moves a ratio by several percent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path

import pytest

from evaluate import http_check
from evaluate.http_check import CHALLENGER, REFERENCE, CheckPlan, PhaseFigures, compare, http_figures
from evaluate.runner import contestants
from evaluate.sim import simulate
from gateway.config import config_from_dict


def _as_loadgen(records, time_scale: float) -> list[dict]:
    """Harness request records as loadgen's requests.jsonl lines from twins running at F."""
    f = time_scale
    return [
        {
            "start_s": r.t_send * f,
            "ok": True,
            "output_tokens": r.tokens,
            "backend": r.backend,
            "ttft_ms": (r.t_first - r.t_send) * f * 1000.0,
            "decode_throughput": r.decode_tok_s / f if r.decode_tok_s else None,
        }
        for r in records
    ]


@pytest.mark.parametrize("policy", ["least_inflight", "goodput/latency"])
def test_http_figures_match_the_harness_on_the_same_requests(policy: str) -> None:
    """Run a phase longer than the window so that every request emitting inside it finished;
    the HTTP-side figures from those records (times scaled by F, as loadgen would see them) equal
    the harness's over the window: same request tok/s, aggregate within 0.5% (tokens spread evenly
    over a request instead of counted per engine step)."""
    plan = CheckPlan(concurrencies=(8,), phase_s=40.0, time_scale=0.1)
    long = dataclasses.replace(plan, phase_s=80.0)
    scn = long.scenario(8)
    run = simulate(scn, contestants(plan.pool, ["latency"], 0)[policy][1], seed=0)
    figures = http_figures(_as_loadgen(run.records, plan.time_scale), plan, plan.pool)
    exact_tokens = sum(k for t, k in run.tokens_at if t < plan.phase_s)
    assert figures.aggregate_tok_s == pytest.approx(exact_tokens / plan.phase_s, rel=0.005)
    inside = [r.decode_tok_s for r in run.records if r.t_last < plan.phase_s and r.decode_tok_s]
    assert figures.requests == len(inside)
    assert figures.mean_request_tok_s == pytest.approx(sum(inside) / len(inside), rel=1e-9)
    sent = [r for r in run.records if r.t_send < plan.phase_s]
    assert sum(figures.backend_share.values()) == pytest.approx(1.0)
    for name, share in figures.backend_share.items():
        assert share == pytest.approx(sum(r.backend == name for r in sent) / len(sent))


def test_http_figures_window_and_failures() -> None:
    plan = CheckPlan(concurrencies=(1,), phase_s=10.0, time_scale=0.5)
    recs = [
        # 101 tokens: first at 1 s, last at 1 + 100 / 50 = 3 s (simulated: times / F, rates x F)
        {
            "start_s": 0.0,
            "ok": True,
            "output_tokens": 101,
            "backend": "k26-ar",
            "ttft_ms": 500.0,
            "decode_throughput": 100.0,
        },
        # first token at 9 s, last at 13 s: a quarter of the other 100 inside the window, no rate sample
        {
            "start_s": 4.0,
            "ok": True,
            "output_tokens": 101,
            "backend": "k26-ddtree",
            "ttft_ms": 500.0,
            "decode_throughput": 50.0,
        },
        {"start_s": 1.0, "ok": False, "error": "http_503", "backend": "k26-ddtree"},
        {
            "start_s": 6.0,
            "ok": True,
            "output_tokens": 10,
            "backend": "k26-ar",
            "ttft_ms": 1.0,
            "decode_throughput": 10.0,
        },  # sent after the window: not counted anywhere
    ]
    f = http_figures(recs, plan, plan.pool)
    assert f.aggregate_tok_s == pytest.approx((101 + 1 + 25) / 10.0)
    assert f.requests == 1 and f.mean_request_tok_s == pytest.approx(50.0)
    assert f.errors == 1
    assert f.backend_share["k26-ar"] == pytest.approx(1 / 3)
    assert f.backend_share["k26-ddtree"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("policy", ["least_inflight", "goodput/latency"])
def test_gateway_config_is_valid_and_mirrors_the_harness(policy: str) -> None:
    plan = CheckPlan(time_scale=0.2)
    twins = {name: f"http://127.0.0.1:{30000 + i}" for i, name in enumerate(plan.pool)}
    data = tomllib.loads(http_check.gateway_toml(plan, policy, 8123, twins))
    config = config_from_dict(data)
    assert [b.name for b in config.backends] == list(plan.pool)
    assert config.policy_for("kimi-k2.6") == policy.partition("/")[0]
    assert config.health.interval_s == pytest.approx(plan.poll_s * plan.time_scale)
    assert config.gateway.objective == "latency"
    assert not config.logging.access_log


def test_compare_flags_a_disagreement() -> None:
    plan = CheckPlan(concurrencies=(4,), tolerance=0.10)

    def fig(agg: float, req: float) -> list[PhaseFigures]:
        return [PhaseFigures(aggregate_tok_s=agg, mean_request_tok_s=req, requests=10, backend_share={})]

    virtual = {REFERENCE: fig(100.0, 100.0), CHALLENGER: fig(140.0, 120.0)}
    http = {REFERENCE: fig(50.0, 50.0), CHALLENGER: fig(72.0, 50.0)}  # 1.44 vs 1.40; 1.00 vs 1.20
    rows = {r.metric: r for r in compare(plan, virtual, http)}
    assert rows["aggregate_tok_s"].agrees and rows["aggregate_tok_s"].diff == pytest.approx(1.44 / 1.4 - 1)
    assert not rows["mean_request_tok_s"].agrees
    http[REFERENCE] = fig(0.0, 0.0)  # nothing measured: never agrees
    assert not any(r.agrees for r in compare(plan, virtual, http))


def test_dataset_lines_carry_the_scenarios_max_tokens(tmp_path: Path) -> None:
    plan = CheckPlan(min_tokens=100, max_tokens=120)
    items = http_check.write_dataset(plan, tmp_path / "d.jsonl", 50)
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [(x["prompt"], x["max_tokens"]) for x in lines] == items
    assert all(x["domain"] == "math" and 100 <= x["max_tokens"] <= 120 for x in lines)
    assert len({x["prompt"] for x in lines}) > 10


def test_reduced_run_end_to_end(tmp_path: Path) -> None:
    """One concurrency level, short requests, 30 simulated seconds at 10x: the whole pipeline
    (warm-up, both gateways, loadgen, figures, table, JSON, exit status) and the direction of the
    result: goodput beats least_inflight on both metrics, as the virtual clock says it does."""
    out = tmp_path / "check"
    code = http_check.main(
        [
            "--time-scale",
            "0.1",
            "--concurrency",
            "4",
            "--phase-seconds",
            "30",
            "--min-tokens",
            "96",
            "--max-tokens",
            "160",
            "--warmup-requests",
            "1",
            "--output",
            str(out),
        ]
    )
    assert code in (0, 1)  # 1 = a ratio outside 10%: reported, not a failure of this test
    res = json.loads((out / "http_check.json").read_text())
    assert code == (0 if res["agrees"] else 1)
    rows = res["rows"]
    assert [r["metric"] for r in rows] == ["mean_request_tok_s", "aggregate_tok_s"]
    for r in rows:
        for key in ("virtual_ratio", "http_ratio", "diff"):
            assert math.isfinite(r[key]), (key, r)
        assert r["virtual_ratio"] > 1.0, r  # the scenario was chosen for this
        assert r["http_ratio"] > 1.0, r
    for side in ("virtual", "http"):
        for policy in (REFERENCE, CHALLENGER):
            (phase,) = res[side][policy]
            assert phase["requests"] >= 20 and phase["errors"] == 0
            assert sum(phase["backend_share"].values()) == pytest.approx(1.0)
    # the warm-up measured every backend on both sides; the AR twin keeps its engine speed
    assert set(res["warmup"]) == set(CheckPlan().pool)
    assert all(w["virtual"] > 0 and w["http"] > 0 for w in res["warmup"].values())
    # The engine's AR speed is R1; the HTTP figure of one warm-up request is a wall-clock measurement of
    # a 10x-speed twin, which a busy machine starves: the check reports its distance, the test does not.
    assert res["warmup"]["k26-ar"]["virtual"] == pytest.approx(26.3, rel=0.05)
