"""`make bench` in its tiny mode, so the benchmark keeps running: schema and sanity, no timed assertion."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import REPO

FIGURES = {
    "ns_c1_added_p50",
    "ns_c1_added_p99",
    "ns_c32_added_p50",
    "ns_c32_added_p99",
    "ns_max_rps",
    "ns_cpu_per_request",
    "st_c1_added_ttft_p50",
    "st_c32_added_ttft_p99",
    "st_cpu_per_chunk",
    "st_max_chunks_per_s",
    "tracing_throughput_cost",
    "routing_goodput_4_backends",
    "routing_goodput_16_backends",
    "rss_idle",
    "rss_after_requests",
    "rss_growth_after_warm",
    "bare_cpu_per_request",
    "bare_cpu_per_chunk",
    "st_cpu_per_chunk_over_bare",
    "ns_c1_added_p50_http",
    "ns_c32_vs_direct_http",
    "st_c1_added_ttft_p50_http",
    "gw_off_reads_per_response",
}
ROUTER_FIGURES = {
    "router_ns_c1_added_p50_http",
    "router_ns_c32_vs_direct_http",
    "router_ns_max_rps",
    "router_reads_per_response",
}
POSITIVE = {
    "ns_max_rps",
    "ns_cpu_per_request",
    "st_cpu_per_chunk",
    "st_max_chunks_per_s",
    "routing_goodput_4_backends",
    "routing_goodput_16_backends",
    "rss_idle",
    "rss_after_requests",
    "bare_cpu_per_request",
    "bare_cpu_per_chunk",
    "st_cpu_per_chunk_over_bare",
    "ns_c32_vs_direct_http",
    "gw_off_reads_per_response",
}


def test_bench_quick_writes_results(tmp_path):
    """With SGLang's Rust router when its bench venv is there (`make bench` makes it), without it
    otherwise."""
    out = tmp_path / "results.json"
    router = (REPO / ".venv-router" / "bin" / "python").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gateway_bench", "--quick", "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "status" in proc.stdout and "routing decision" in proc.stdout  # the printed table
    result = json.loads(out.read_text())
    assert result["schema"] == 1
    assert {"quick", "repeats", "pinning", "server", "cpus", "duration_s"} <= set(result["meta"])
    figures = result["figures"]
    for f in figures:
        assert set(f) == {"name", "tracing", "value", "unit", "target", "better", "status"}
        assert f["status"] in ("PASS", "MISS", "info")
        assert (f["target"] is None) == (f["status"] == "info")
    names = {f["name"] for f in figures}
    assert names >= FIGURES
    assert (names >= ROUTER_FIGURES) == router
    c1_http = next(f for f in figures if f["name"] == "ns_c1_added_p50_http")
    assert (c1_http["target"] is not None) == router  # the target is the router's own figure
    for f in figures:
        if f["name"] in POSITIVE:
            assert f["value"] > 0, f
    assert {f["tracing"] for f in figures if f["name"] == "ns_max_rps"} == {"off", "on", "on10"}
    for scenario in (
        "ns_c1",
        "ns_c32",
        "ns_max",
        "st_c1",
        "st_c32",
        "st_max",
        "ns_c1_http",
        "ns_c32_http",
        "st_c1_http",
    ):
        http = scenario.endswith("_http")
        targets = (
            ("direct", "gw_off")
            + (() if http else ("gw_on",))
            + (("gw_on10",) if scenario in ("ns_c1", "ns_max", "st_max") else ())
            + (("bare",) if scenario in ("ns_max", "st_c32") else ())
            + (("router",) if router and scenario not in ("ns_c32", "st_c32") else ())
        )
        assert set(result["runs"][scenario]) == set(targets)
        for target in targets:
            (level,) = result["runs"][scenario][target]
            assert level["n"] > 0 and level["errors"] == 0, (scenario, target, level)
            if scenario.startswith("st_"):
                assert level["chunks"] == 64 * level["n"]  # every content chunk relayed
    assert result["memory"]["requests"] >= 3000
    assert result["vs_last_run"]["figures"] == {}  # no earlier results file


def test_instruction_counts_read_callgrinds_total(tmp_path):
    from bench.callgrind import total_instructions

    out = tmp_path / "callgrind.out.1"
    out.write_text(
        "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\n"
        "fn=(1) main\n16 3\nsummary: 2044579026\ntotals: 2044579026\n"
    )
    assert total_instructions(out) == 2044579026
    (tmp_path / "empty").write_text("events: Ir\n")
    with pytest.raises(ValueError):
        total_instructions(tmp_path / "empty")


def test_instruction_counts_say_what_they_need_without_valgrind(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no valgrind on this PATH
    proc = subprocess.run(
        [sys.executable, "-m", "bench.instructions"], cwd=REPO, capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 2 and "needs valgrind" in proc.stderr


def test_figures_are_compared_with_the_last_run(tmp_path):
    from bench.gateway_bench import compare_with_last

    def fig(name, value, tracing="off"):
        return {"name": name, "tracing": tracing, "value": value}

    last = tmp_path / "results.json"
    last.write_text(json.dumps({"figures": [fig("a", 100.0), fig("b", 10.0), fig("b", 4.0, "on"), fig("z", 0.0)]}))
    got = compare_with_last([fig("a", 104.0), fig("b", 9.0), fig("b", 4.0, "on"), fig("new", 1.0), fig("z", 1.0)], last)
    assert set(got["figures"]) == {"a/off", "b/off", "b/on"}  # a new figure, or a zero before, has no change
    assert got["figures"]["b/off"]["change_pct"] == pytest.approx(-10.0)
    assert got["outside"] == ["b/off"]
    assert compare_with_last([fig("a", 1.0)], tmp_path / "missing.json")["figures"] == {}


def test_exporter_cost_runs_and_reports_the_exporter_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.exporter_cost", "--rate", "200", "--seconds", "0.5", "--rounds", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gw_on: gateway CPU per request" in proc.stdout and "exporter process" in proc.stdout
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.startswith("gw_")}
    assert float(rows["gw_on"][-1]) > 0  # the exporter process did work for the traced gateway


def test_split_writes_compares_one_and_two_write_answers():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.split_writes", "--requests", "50", "--rounds", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith(("one_write/", "two_writes/"))}
    assert rows == {"one_write/raw", "two_writes/raw", "one_write/http", "two_writes/http"}
    assert "http  client: two writes cost" in proc.stdout


def test_a_router_that_served_nothing_voids_the_routers_verdict():
    """SGLang's router answers /health before its workers are registered: a run that started then
    served nothing. Its row must not drop out of the comparison and leave a weaker peer as the one
    to beat."""
    from bench.routers.run import Result, verdicts

    def row(name: str, tok_s: float | None, requests: int = 24) -> Result:
        return Result(contestant=name, workload="closed-c4", requests=requests, mean_request_tok_s=tok_s, e2e_p99_s=2.0)

    served = [row("specroute", 120.0), row("litellm/least-busy-noar", 90.0), row("only:k26-ddtree", 115.0)]
    (full,) = verdicts(served)
    assert full["holds"] and full["peers_missing"] == []
    (partial,) = verdicts([*served, row("sgl/cache_aware-noar", None, requests=0)])
    assert partial["best_peer"] == "litellm/least-busy-noar"
    assert partial["peers_missing"] == ["sgl/cache_aware-noar"] and not partial["holds"]
