"""`make bench` in its tiny mode, so the benchmark keeps running: schema and sanity, no timed assertion."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import REPO

FIGURES = {
    "ns_c1_added_p50", "ns_c1_added_p99", "ns_c32_added_p50", "ns_c32_added_p99", "ns_max_rps",
    "ns_cpu_per_request", "st_c1_added_ttft_p50", "st_c32_added_ttft_p99", "st_cpu_per_chunk",
    "st_max_chunks_per_s", "tracing_throughput_cost", "routing_goodput_4_backends",
    "routing_goodput_16_backends", "rss_idle", "rss_after_requests", "rss_growth_after_warm",
    "bare_cpu_per_request", "bare_cpu_per_chunk", "st_cpu_per_chunk_over_bare",
}
POSITIVE = {"ns_max_rps", "ns_cpu_per_request", "st_cpu_per_chunk", "st_max_chunks_per_s",
            "routing_goodput_4_backends", "routing_goodput_16_backends", "rss_idle", "rss_after_requests",
            "bare_cpu_per_request", "bare_cpu_per_chunk", "st_cpu_per_chunk_over_bare"}


def test_bench_quick_writes_results(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gateway_bench", "--quick", "--output", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=110)
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
    assert FIGURES <= names
    for f in figures:
        if f["name"] in POSITIVE:
            assert f["value"] > 0, f
    assert {f["tracing"] for f in figures if f["name"] == "ns_max_rps"} == {"off", "on", "on10"}
    for scenario in ("ns_c1", "ns_c32", "ns_max", "st_c1", "st_c32", "st_max"):
        targets = ("direct", "gw_off", "gw_on") + (("gw_on10",) if scenario in ("ns_c1", "ns_max", "st_max") else ()) \
            + (("bare",) if scenario in ("ns_max", "st_c32") else ())
        assert set(result["runs"][scenario]) == set(targets)
        for target in targets:
            (level,) = result["runs"][scenario][target]
            assert level["n"] > 0 and level["errors"] == 0, (scenario, target, level)
            if scenario.startswith("st_"):
                assert level["chunks"] == 64 * level["n"]  # every content chunk relayed
    assert result["memory"]["requests"] >= 3000


def test_instruction_counts_read_callgrinds_total(tmp_path):
    from bench.instructions import total_instructions

    out = tmp_path / "callgrind.out.1"
    out.write_text("# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\n"
                   "fn=(1) main\n16 3\nsummary: 2044579026\ntotals: 2044579026\n")
    assert total_instructions(out) == 2044579026
    (tmp_path / "empty").write_text("events: Ir\n")
    with pytest.raises(ValueError):
        total_instructions(tmp_path / "empty")


def test_instruction_counts_say_what_they_need_without_valgrind(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no valgrind on this PATH
    proc = subprocess.run([sys.executable, "-m", "bench.instructions"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2 and "needs valgrind" in proc.stderr
