"""Load modes, request options and progress against the in-process test server (what needs no
server: tests/unit/test_loadgen_modes_offline.py)."""

from __future__ import annotations

import asyncio
import io
import itertools
import random
from pathlib import Path

import aiohttp
import pytest
import uvloop
from rich.console import Console

from loadgen.client import RequestOptions, Target
from loadgen.datasets import load_dataset
from loadgen.driver import LevelSpec, arrival_offsets, run_level
from loadgen.runner import Plan, execute
from loadgen.summary import Summary
from loadgen.targets import TargetError, resolve
from loadgen.testserver import RunningServer, ServerConfig
from tests.unit.test_loadgen_modes_offline import _summary


def _level(cfg: ServerConfig, spec: LevelSpec, *, seed: int = 0, dataset: str = "mixed", loop: str = "asyncio", **opts):
    async def main():
        async with RunningServer(cfg) as srv, aiohttp.ClientSession() as session:
            target = Target(label="t", url=srv.url, model="test-model")
            result = await run_level(
                session, target, load_dataset(dataset), spec, RequestOptions(**{"max_tokens": 16, **opts}), seed=seed
            )
            return result, srv.stats

    return uvloop.run(main()) if loop == "uvloop" else asyncio.run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # loadgen's CLI runs on uvloop
def test_poisson_arrivals_follow_seeded_schedule_never_early(loop: str) -> None:
    rate, n = 400.0, 40
    spec = LevelSpec(concurrency=None, request_rate=rate, num_prompts=n)
    result, _stats = _level(ServerConfig(), spec, seed=7, loop=loop)
    expected = list(itertools.islice(arrival_offsets(rate, random.Random(7)), n))
    starts = [r.start_s for r in result.records]
    assert len(starts) == n and all(r.ok for r in result.records)
    assert all(s >= e - 1e-9 for s, e in zip(starts, expected, strict=False))  # never sent before its time
    gaps = [b - a for a, b in itertools.pairwise(expected)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / rate, rel=0.5)  # it is a rate-R process
    assert result.level.mode == "open" and result.level.request_rate == rate


def test_open_loop_cap_bounds_in_flight() -> None:
    # rate inf: all 20 arrive at once; the cap of 3 must hold them back
    cfg = ServerConfig(hold_until_inflight=3, chunk_delay=0.001)
    result, stats = _level(cfg, LevelSpec(concurrency=3, request_rate=float("inf"), num_prompts=20))
    assert result.level.completed == 20
    assert stats.max_inflight == 3


def test_a_capped_open_loop_reports_how_long_arrivals_waited_for_a_slot() -> None:
    # all 20 arrive at once and 3 run at a time: the later ones wait in the client, not the server
    cfg = ServerConfig(hold_until_inflight=3, chunk_delay=0.001)
    result, _ = _level(cfg, LevelSpec(concurrency=3, request_rate=float("inf"), num_prompts=20))
    waits = sorted(r.client_wait_ms for r in result.records)
    by_start = sorted(result.records, key=lambda r: r.start_s)
    # all are due at the level's start: each waited from then until just before it was sent
    assert all(0 <= r.client_wait_ms <= r.start_s * 1000 for r in by_start)
    assert [r.client_wait_ms for r in by_start] == waits
    assert waits[-1] > waits[0] and result.level.p99_client_wait_ms >= result.level.mean_client_wait_ms > 0
    closed, _ = _level(ServerConfig(), LevelSpec(concurrency=2, num_prompts=4))
    assert all(r.client_wait_ms is None for r in closed.records) and closed.level.mean_client_wait_ms is None


def test_uncapped_open_loop_sends_everything_at_once() -> None:
    cfg = ServerConfig(hold_until_inflight=12)
    result, stats = _level(cfg, LevelSpec(concurrency=None, request_rate=float("inf"), num_prompts=12))
    assert result.level.completed == 12 and stats.max_inflight == 12
    assert result.level.max_concurrency is None


def test_warmup_runs_first_and_is_excluded() -> None:
    result, stats = _level(ServerConfig(), LevelSpec(concurrency=2, num_prompts=5, warmup=3))
    assert stats.requests == 8
    assert result.level.completed == 5 and [r.index for r in result.records] == list(range(5))
    assert result.level.total_output_tokens == 5 * 16


def test_duration_stops_issuing_at_deadline() -> None:
    cfg = ServerConfig(chunk_delay=0.002)  # ~35 ms per request
    result, _ = _level(cfg, LevelSpec(concurrency=2, duration=0.25))
    starts = [r.start_s for r in result.records]
    assert result.level.completed == len(starts) >= 2
    assert max(starts) < 0.25 <= result.level.duration


def test_no_stream_measures_whole_response() -> None:
    result, _ = _level(
        ServerConfig(speculative=True, tokens_per_chunk=4), LevelSpec(concurrency=2, num_prompts=4), stream=False
    )
    lv = result.level
    assert lv.completed == 4 and lv.total_output_tokens == 64
    assert lv.median_itl_ms is None and lv.mean_tpot_ms is None
    assert lv.accept_length == pytest.approx(4.0)
    assert all(r.ttft_ms == r.e2e_ms for r in result.records)


def test_completions_endpoint() -> None:
    result, _ = _level(ServerConfig(), LevelSpec(concurrency=1, num_prompts=2), endpoint="completions")
    assert result.level.completed == 2 and result.level.total_output_tokens == 32
    assert result.level.token_count_mismatches == 0


def test_spec_details_off_leaves_accept_length_unknown() -> None:
    cfg = ServerConfig(speculative=True, tokens_per_chunk=4)
    on, _ = _level(cfg, LevelSpec(concurrency=1, num_prompts=2))
    off, _ = _level(cfg, LevelSpec(concurrency=1, num_prompts=2), spec_details=False)
    assert on.level.accept_length == pytest.approx(4.0)
    assert off.level.accept_length is None


def test_errors_are_counted_by_kind_never_dropped() -> None:
    cfg = ServerConfig(error_every=3, http_error_every=5)
    result, _ = _level(cfg, LevelSpec(concurrency=1, num_prompts=15))
    lv = result.level
    assert lv.completed + lv.failed == 15
    # requests 3, 6, 9, 12 fail mid-stream; 5, 10, 15 get 503 (15 is a multiple of both:
    # the HTTP error comes first)
    assert lv.errors == {"stream_error": 4, "http_503": 3}
    detail = {r.error: r.error_detail for r in result.records if r.error}
    assert detail == {"stream_error": "injected failure", "http_503": "injected overload"}


def test_api_key_preflight() -> None:
    async def main():
        async with RunningServer(ServerConfig(api_key="sekret")) as srv, aiohttp.ClientSession() as session:
            with pytest.raises(TargetError) as bad:
                await resolve(session, srv.url, gateway_url=srv.url, model=None, api_key="x")
            good = await resolve(session, srv.url, gateway_url=srv.url, model=None, api_key="sekret")
            return str(bad.value), good

    bad, good = asyncio.run(main())
    assert "HTTP 401" in bad and "--api-key" in bad and "\n" not in bad
    assert good.model == "test-model"


def test_progress_display_when_forced() -> None:
    buf = io.StringIO()
    err = Console(file=buf, force_terminal=True, width=120)

    async def main():
        async with RunningServer(ServerConfig(chunk_delay=0.001)) as srv:
            plan = Plan(
                targets=[srv.url],
                gateway_url=srv.url,
                model=None,
                dataset=load_dataset("math"),
                levels=[LevelSpec(concurrency=2, num_prompts=4)],
                opts=RequestOptions(max_tokens=8),
                progress=True,
            )
            return await execute(plan, Console(file=io.StringIO()), err)

    summary, errors = asyncio.run(main())
    assert errors == [] and summary.runs[0].levels[0].completed == 4
    assert "C=2" in buf.getvalue() and "4/4" in buf.getvalue()


# --- datasets -----------------------------------------------------------------------------------


# --- compare and plots --------------------------------------------------------------------------


def test_plots_are_pngs(tmp_path: Path) -> None:
    # Here, not in tests/unit: matplotlib runs `fc-list` (a process) to build its font cache when cold.
    pytest.importorskip("matplotlib")
    from loadgen.plots import write_plots

    paths = write_plots(Summary(runs=_summary("a", 1.0, 1.0).runs + _summary("b", 2, 2).runs), tmp_path)
    assert {p.name for p in paths} == {"throughput_aggregate.png", "throughput_single.png", "ttft.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
