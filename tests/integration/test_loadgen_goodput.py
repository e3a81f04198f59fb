"""`loadgen --goodput`: SLO goodput as SGLang's `bench_serving --goodput` defines it
(`sglang/benchmark/goodput.py`, 0.5.23): a request is good when it succeeded and met every SLO
given; `request_goodput` is good requests per second of the level, `slo_attainment` good requests
over requests sent, failed ones included."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelSpec
from loadgen.metrics import goodput, summarize
from loadgen.report import print_table
from loadgen.runner import Plan, execute
from loadgen.summary import RequestRecord, Summary
from loadgen.testserver import RunningServer, ServerConfig
from tests.support import free_port, running


def _record(i: int, *, ok: bool = True, ttft: float | None = 100.0, e2e: float = 1000.0, n: int = 10) -> RequestRecord:
    tpot = (e2e - ttft) / (n - 1) if ttft is not None and n > 1 else None
    return RequestRecord(
        index=i,
        target="t",
        max_concurrency=1,
        request_rate=None,
        domain="chat",
        start_s=0.0,
        ok=ok,
        ttft_ms=ttft,
        e2e_ms=e2e,
        tpot_ms=tpot,
        output_tokens=n,
    )


def test_goodput_counts_requests_meeting_every_slo_over_the_level() -> None:
    records = [
        _record(0),  # ttft 100, tpot 100: good
        _record(1, ttft=600.0),  # TTFT over: tpot (1000 - 600) / 9 = 44 is within
        _record(2, e2e=3000.0),  # TPOT (3000 - 100) / 9 = 322 over
        _record(3, ttft=150.0, e2e=150.0, n=1),  # one token: no TPOT (0, as SGLang counts it): good
        _record(4, ok=False),  # failed: never good, but counted as sent
        _record(5, ttft=None, n=0),  # succeeded with no output: no TTFT, which meets no TTFT SLO
    ]
    g = goodput(records, {"ttft": 500.0, "tpot": 200.0}, duration=2.0)
    assert g.goodput_slos_ms == {"ttft": 500.0, "tpot": 200.0}
    assert g.request_goodput == 2 / 2.0
    assert g.slo_attainment == 2 / 6
    # ttft: 0, 2, 3 met it; tpot: 0, 1, 3 and 5 (no tokens: 0)
    assert g.slo_attainment_by_metric == {"ttft": 3 / 6, "tpot": 4 / 6}
    # e2el alone: every successful request within 1 s
    assert goodput(records, {"e2el": 1000.0}, duration=2.0).slo_attainment_by_metric == {"e2el": 4 / 6}
    level = summarize(records, [], duration=2.0, max_concurrency=1, request_rate=None, mode="closed")
    assert level.goodput is None  # only when asked for


def _plan(url: str, slos_ms: dict[str, float], time_scale: float = 1.0) -> Plan:
    return Plan(
        targets=[url],
        gateway_url="http://127.0.0.1:9",
        model=None,
        dataset=load_dataset("chat"),
        levels=[LevelSpec(concurrency=2, num_prompts=6)],
        opts=RequestOptions(max_tokens=8),
        progress=False,
        goodput_slos_ms=slos_ms,
        time_scale=time_scale,
    )


def _run(settings: list[tuple[dict[str, float], float]]) -> list[Summary]:
    """One level per (SLOs in ms, time scale) against a test server."""

    async def main() -> list[Summary]:
        # 10 ms between tokens at least: every request's TPOT is >= 10 ms on the wall clock
        async with RunningServer(ServerConfig(chunk_delay=0.01)) as srv:
            out = []
            for slos_ms, time_scale in settings:
                summary, errors = await execute(_plan(srv.url, slos_ms, time_scale))
                assert errors == []
                out.append(summary)
            return out

    return asyncio.run(main())


def test_a_run_reports_goodput_judged_in_simulated_time() -> None:
    generous = ({"ttft": 60_000.0, "tpot": 1_000.0}, 1.0)
    too_tight = ({"ttft": 60_000.0, "tpot": 5.0}, 1.0)
    # At time scale 0.5 a 10 ms wall-clock gap is 20 ms of simulated time: over a 15 ms SLO
    scaled = ({"tpot": 15.0}, 0.5)
    good, tight, slow = (s.runs[0].levels[0] for s in _run([generous, too_tight, scaled]))
    assert good.goodput is not None and tight.goodput is not None and slow.goodput is not None
    assert good.completed == 6 and good.goodput.slo_attainment == 1.0
    assert good.goodput.request_goodput == pytest.approx(6 / good.duration)
    assert tight.goodput.request_goodput == 0.0 and tight.goodput.slo_attainment == 0.0
    assert tight.goodput.slo_attainment_by_metric == {"ttft": 1.0, "tpot": 0.0}
    assert slow.goodput.slo_attainment == 0.0
    assert slow.goodput.goodput_slos_ms == {"tpot": pytest.approx(15.0)}  # reported as asked, in simulated ms
    assert slow.mean_tpot_ms is not None and slow.mean_tpot_ms >= 20.0


def test_the_cli_takes_seconds_and_prints_goodput(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = [sys.executable, "-m", "loadgen.testserver", "--port", str(port), "--chunk-delay", "0.01"]
    with running(server, ready_url=url + "/ready"):
        p = subprocess.run(
            [
                *(sys.executable, "-m", "loadgen", "--target", url, "--concurrency", "2", "--num-prompts", "4"),
                *("--max-tokens", "8", "--goodput", "ttft=60,tpot=0.005", "--output", str(tmp_path), "--no-plots"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert p.returncode == 0, p.stderr
    level = json.loads((tmp_path / "summary.json").read_text())["runs"][0]["levels"][0]
    assert level["goodput"] == {
        "goodput_slos_ms": {"ttft": 60_000.0, "tpot": 5.0},
        "request_goodput": 0.0,
        "slo_attainment": 0.0,
        "slo_attainment_by_metric": {"ttft": 1.0, "tpot": 0.0},
    }
    assert "goodput req/s" in p.stdout and "goodput (ttft <= 60 s, tpot <= 0.005 s)" in p.stdout
    console = Console(record=True, width=200)
    print_table(tmp_path / "summary.json", console)
    assert "0.00 (0%)" in console.export_text()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("ttft", "expected NAME=SECONDS"), ("itl=1", "with NAME in ttft, tpot, e2el"), ("ttft=0", "seconds > 0")],
)
def test_bad_goodput_values_exit_2_with_one_line(value: str, expected: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "loadgen", "--target", "http://127.0.0.1:9", "--goodput", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and expected in p.stderr and "Traceback" not in p.stderr
