"""Load modes, request options, datasets, compare, plots and progress against the in-process
test server."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import random
from pathlib import Path

import aiohttp
import msgspec
import pytest
import uvloop
from rich.console import Console

from loadgen.client import RequestOptions, Target
from loadgen.datasets import DatasetError, RandomSpec, load_dataset
from loadgen.driver import LevelSpec, arrival_offsets, run_level
from loadgen.report import compare, level_notes
from loadgen.runner import Plan, execute
from loadgen.summary import Level, Run, Summary
from loadgen.targets import TargetError, resolve
from loadgen.testserver import RunningServer, ServerConfig


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


def test_arrival_schedule_depends_on_seed_only() -> None:
    a = list(itertools.islice(arrival_offsets(5.0, random.Random(1)), 5))
    b = list(itertools.islice(arrival_offsets(5.0, random.Random(1)), 5))
    c = list(itertools.islice(arrival_offsets(5.0, random.Random(2)), 5))
    assert a == b != c and a[0] == 0.0
    assert list(itertools.islice(arrival_offsets(float("inf"), random.Random(1)), 3)) == [0.0] * 3


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


def test_a_capped_open_loop_that_fell_behind_says_so_under_its_row() -> None:
    level = Level(
        max_concurrency=1, completed=30, failed=0, duration=10.0, total_output_tokens=0, output_throughput=0.0,
        request_throughput=3.0, mean_request_output_throughput=None, median_ttft_ms=40.0, p99_ttft_ms=50.0,
        mean_tpot_ms=None, median_itl_ms=None, mean_e2e_latency_ms=None, accept_length=None, backends={},
        mode="open", request_rate=6.0, mean_client_wait_ms=2100.0, p99_client_wait_ms=4900.0,
    )  # fmt: skip
    (note,) = [n for n in level_notes(level) if n.startswith("open loop")]
    assert "3.00 requests/s sent of 6/s asked" in note and "p99 4,900 ms" in note
    quiet = msgspec.structs.replace(level, p99_client_wait_ms=3.0, mean_client_wait_ms=1.0)
    assert not [n for n in level_notes(quiet) if n.startswith("open loop")]


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


def test_mixed_interleaves_domains() -> None:
    ds = load_dataset("mixed")
    assert [p.domain for p in ds.take(6)] == ["math", "code", "chat"] * 2
    assert {p.domain for p in ds.prompts} == {"math", "code", "chat"}
    assert len(load_dataset("math").prompts) >= 20


def test_random_dataset_lengths_and_seed() -> None:
    spec = RandomSpec(input_len=50, output_len=40, range_ratio=0.5, num_prompts=30)
    a, b = load_dataset("random", seed=1, random_spec=spec), load_dataset("random", seed=1, random_spec=spec)
    c = load_dataset("random", seed=2, random_spec=spec)
    assert a == b and a != c
    for p in a.prompts:
        assert 25 <= len(p.messages[0].content.split()) <= 50
        assert 20 <= (p.max_tokens or 0) <= 40


def test_jsonl_dataset(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"prompt": "hi", "domain": "chat"}\n\n"bare string"\n'
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", '
        '"content": "u"}], "max_tokens": 9}\n'
    )
    ds = load_dataset(f"jsonl:{f}")
    assert [p.domain for p in ds.prompts] == ["chat", "jsonl", "jsonl"]
    assert ds.prompts[2].max_tokens == 9 and ds.prompts[2].messages[0].role == "system"


@pytest.mark.parametrize(
    "body, where",
    [
        ('{"prompt": "ok"}\n{"prompt": "ok"}\n{"prompt": broken}\n', ":3:"),
        ('{"prompt": "ok"}\n{"nothing": 1}\n', ":2: expected a non-empty"),
        ('{"prompt": 5}\n', ":1:"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, body: str, where: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(body)
    with pytest.raises(DatasetError) as e:
        load_dataset(f"jsonl:{f}")
    assert where in str(e.value) and "\n" not in str(e.value)


def test_sharegpt_dataset_and_malformed_line(tmp_path: Path) -> None:
    good = tmp_path / "sg.json"
    good.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a"}]},
                {"conversations": [{"from": "gpt", "value": "no human"}]},
                {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q2"}]},
            ],
            indent=1,
        )
    )
    ds = load_dataset(f"sharegpt:{good}")
    assert [p.messages[-1].content for p in ds.prompts] == ["q1", "q2"]
    assert [m.role for m in ds.prompts[1].messages] == ["system", "user"]  # the leading system turn is kept
    assert {p.domain for p in ds.prompts} == {"sharegpt"}
    assert ds.skipped == {"no user turn": 1}
    bad = tmp_path / "bad.json"
    bad.write_text('[\n {"conversations": []},\n {"conversations": [}\n]\n')
    with pytest.raises(DatasetError) as e:
        load_dataset(f"sharegpt:{bad}")
    assert f"{bad}:3:" in str(e.value)


# --- compare and plots --------------------------------------------------------------------------


def _summary(target: str, agg: float, ttft: float) -> Summary:
    lv = Level(
        max_concurrency=4,
        completed=8,
        failed=0,
        duration=2.0,
        total_output_tokens=100,
        output_throughput=agg,
        request_throughput=4.0,
        mean_request_output_throughput=agg / 4,
        median_ttft_ms=ttft,
        p99_ttft_ms=ttft * 2,
        mean_tpot_ms=10.0,
        median_itl_ms=10.0,
        mean_e2e_latency_ms=500.0,
        accept_length=None,
        backends={},
    )
    return Summary(runs=[Run(target=target, url="http://x", dataset="mixed", levels=[lv])])


def test_compare_ratios(tmp_path: Path) -> None:
    a, b = _summary("k26-ar", 100.0, 50.0), _summary("k26-ar", 250.0, 25.0)
    (tmp_path / "a.json").write_bytes(msgspec.json.encode(a))
    console = Console(record=True, width=200, file=io.StringIO())
    (ratios,) = compare(tmp_path / "a.json", msgspec.to_builtins(b), console)
    assert ratios["output_throughput"] == pytest.approx(2.5)
    assert ratios["median_ttft_ms"] == pytest.approx(0.5)
    assert ratios["accept_length"] is None
    assert "2.500x" in console.export_text()


def test_plots_are_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from loadgen.plots import write_plots

    paths = write_plots(Summary(runs=_summary("a", 1.0, 1.0).runs + _summary("b", 2, 2).runs), tmp_path)
    assert {p.name for p in paths} == {"throughput_aggregate.png", "throughput_single.png", "ttft.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
