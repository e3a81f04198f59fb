"""`loadgen --priority`: SGLang's `priority` field sent as a mix taken in turn by request (by
session), recorded per request and broken down per priority in the summary, with the breakdown's
figures converted back to simulated time like the level's. The bodies are checked where they
arrive (loadgen's test server, a Responses stand-in), the CLI as a real process, and one run
through a real gateway (`[admission] max_inflight = 1`) in front of a twin, whose queue serves the
high class first: that class's TTFT is the lower one because of queue order, not timing. What
needs no server: tests/unit/test_loadgen_priority_options.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from loadgen import timescale
from loadgen.client import RequestOptions, Target
from loadgen.datasets import load_dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.metrics import priority_levels, summarize
from loadgen.summary import PriorityLevel, RequestRecord, Summary, load_summary
from loadgen.testserver import RunningServer, ServerConfig
from tests.conftest import TEST_TIME_SCALE
from tests.loadgen_runs import run_against_test_server
from tests.support import free_port, loadgen, one_slot_gateway, output, serving, wait_until


def _records(path: Path) -> list[RequestRecord]:
    lines = (path / "requests.jsonl").read_bytes().splitlines()
    return [msgspec.json.decode(line, type=RequestRecord) for line in lines]


# ------------------------------------------------------------------------------------ the body


# ------------------------------------------------------------------------- the command line


def test_a_bad_priority_exits_2_from_the_real_command() -> None:
    # nothing listens on the target: the command line is refused before any connection
    proc = subprocess.run(
        loadgen("--target", f"http://127.0.0.1:{free_port()}", "--priority", "0,1.5"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "loadgen: error: argument --priority: not an integer priority: '1.5'" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------- sent in turn, recorded, summed


def _run(
    cfg: ServerConfig, spec: LevelSpec, tmp_path: Path, *, dataset: str = "chat", time_scale: float = 1.0, **opts: Any
) -> tuple[Summary, list[dict[str, Any]]]:
    """One level against loadgen's test server, saved to `tmp_path`; the summary and the bodies."""
    opts = {"max_tokens": 8, **opts}
    summary, srv = run_against_test_server(cfg, dataset, spec, tmp_path, time_scale=time_scale, **opts)
    return summary, list(srv.server.bodies)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_mix_is_sent_in_turn_and_recorded(tmp_path: Path, endpoint: str) -> None:
    cfg = ServerConfig(keep_bodies=100)
    mix = (0, 0, 0, 10)
    # one worker: the bodies arrive in request order
    summary, bodies = _run(cfg, LevelSpec(concurrency=1, num_prompts=10), tmp_path, endpoint=endpoint, priorities=mix)
    assert [b["priority"] for b in bodies] == [mix[i % 4] for i in range(10)]
    records = _records(tmp_path)
    assert sorted(r.index for r in records) == list(range(10))
    assert all(r.priority == mix[r.index % 4] for r in records)
    lv = summary.runs[0].levels[0]
    assert lv.priorities == {"0": 8, "10": 2}
    assert [(p.priority, p.completed, p.failed) for p in lv.by_priority] == [(0, 8, 0), (10, 2, 0)]
    assert load_summary(tmp_path).runs[0].levels[0].by_priority == lv.by_priority  # summary.json has it
    assert "priorities" in (tmp_path / "summary.csv").read_text().splitlines()[0]


def test_by_request_index_at_any_concurrency(tmp_path: Path) -> None:
    summary, bodies = _run(
        ServerConfig(keep_bodies=100), LevelSpec(concurrency=4, num_prompts=12), tmp_path, priorities=(1, 2, 3)
    )
    assert sorted(b["priority"] for b in bodies) == [1] * 4 + [2] * 4 + [3] * 4
    assert all(r.priority == (1, 2, 3)[r.index % 3] for r in _records(tmp_path))
    assert summary.runs[0].levels[0].priorities == {"1": 4, "2": 4, "3": 4}


def test_without_the_option_nothing_is_sent_or_broken_down(tmp_path: Path) -> None:
    summary, bodies = _run(ServerConfig(keep_bodies=100), LevelSpec(concurrency=2, num_prompts=6), tmp_path)
    assert len(bodies) == 6 and all("priority" not in b for b in bodies)
    assert all(r.priority is None for r in _records(tmp_path))
    assert all('"priority":null' in line for line in (tmp_path / "requests.jsonl").read_text().splitlines())
    lv = summary.runs[0].levels[0]
    assert lv.priorities == {} and lv.by_priority == []


def test_sessions_take_the_mix_by_session(tmp_path: Path) -> None:
    summary, bodies = _run(
        ServerConfig(keep_bodies=200),
        LevelSpec(concurrency=2, num_prompts=4),
        tmp_path,
        dataset="sessions",
        priorities=(5, 1),
    )
    records = _records(tmp_path)
    assert {r.session for r in records} == {0, 1, 2, 3} and len(records) == len(bodies) > 4
    assert all(r.priority == (5, 1)[(r.session or 0) % 2] for r in records)  # every turn of a session
    lv = summary.runs[0].levels[0]
    assert sum(lv.priorities.values()) == len(records) == lv.completed
    assert sorted(b["priority"] for b in bodies) == sorted(r.priority or 0 for r in records)


def test_the_breakdown_is_the_levels_own_figures_on_each_subset(tmp_path: Path) -> None:
    # failures of two kinds (an HTTP 503 every 5th request, a mid-stream error every 7th) spread
    # over both classes; a little delay per step so the latencies differ between requests
    cfg = ServerConfig(http_error_every=5, error_every=7, chunk_delay=0.0005)
    summary, _ = _run(cfg, LevelSpec(concurrency=3, num_prompts=40), tmp_path, priorities=(0, 0, 10))
    lv = summary.runs[0].levels[0]
    records = _records(tmp_path)
    assert [p.priority for p in lv.by_priority] == [0, 10]
    assert sum(p.completed for p in lv.by_priority) == lv.completed
    assert sum(p.failed for p in lv.by_priority) == lv.failed > 0
    for p in lv.by_priority:
        subset = [r for r in records if r.priority == p.priority]
        whole = summarize(subset, [], duration=1.0, max_concurrency=3, request_rate=None, mode="closed")
        assert (p.completed, p.failed, p.errors) == (whole.completed, whole.failed, whole.errors)
        assert p.median_ttft_ms == whole.median_ttft_ms and p.p99_ttft_ms == whole.p99_ttft_ms
        assert p.median_e2e_latency_ms == whole.median_e2e_latency_ms
        assert p.p99_e2e_latency_ms == whole.p99_e2e_latency_ms
        assert p.mean_request_output_throughput == whole.mean_request_output_throughput
        assert p.median_ttft_ms is not None and p.mean_request_output_throughput is not None
    assert {k for p in lv.by_priority for k in p.errors} == set(lv.errors)


# ------------------------------------------------------------------------------- time scale


def _same(a: PriorityLevel, b: PriorityLevel) -> bool:
    """Equal, the figures up to float rounding (scaling a percentile or scaling its samples)."""
    figures = [msgspec.to_builtins(p) for p in (a, b)]
    errors = [f.pop("errors", {}) for f in figures]
    return errors[0] == errors[1] and figures[0] == pytest.approx(figures[1])


def test_a_time_scaled_runs_breakdown_is_in_simulated_time(tmp_path: Path) -> None:
    async def level() -> LevelResult:
        async with RunningServer(ServerConfig(chunk_delay=0.0005)) as srv, aiohttp.ClientSession() as http:
            target = Target(label="t", url=srv.url, model="test-model")
            opts = RequestOptions(max_tokens=8, priorities=(0, 3))
            return await run_level(http, target, load_dataset("chat"), LevelSpec(concurrency=2, num_prompts=8), opts)

    result = asyncio.run(level())
    scale = 0.25
    sim = timescale.to_simulated(result, scale)
    assert len(sim.level.by_priority) == 2
    for wall, simulated in zip(result.level.by_priority, sim.level.by_priority, strict=True):
        for name in timescale.PRIORITY_TIME_FIELDS:
            assert getattr(simulated, name) == pytest.approx(getattr(wall, name) / scale)
        assert simulated.mean_request_output_throughput == pytest.approx(
            (wall.mean_request_output_throughput or 0) * scale
        )
        assert (simulated.priority, simulated.completed, simulated.failed) == (wall.priority, wall.completed, 0)
    # the converted breakdown is what the converted records give: one unit throughout
    for a, b in zip(sim.level.by_priority, priority_levels(sim.records), strict=True):
        assert _same(a, b)
    assert sim.level.priorities == result.level.priorities
    # and through a whole run: summary.json and requests.jsonl both in simulated time
    spec = LevelSpec(concurrency=2, num_prompts=8)
    _run(ServerConfig(chunk_delay=0.0005), spec, tmp_path, priorities=(0, 3), time_scale=scale)
    saved = load_summary(tmp_path).runs[0]
    assert saved.time_scale == scale
    for a, b in zip(saved.levels[0].by_priority, priority_levels(_records(tmp_path)), strict=True):
        assert _same(a, b)


# ------------------------------------------------------------------------ report and compare


# ------------------------------------------------------------------------- the Responses API


def test_responses_bodies_carry_it_on_every_chained_turn(tmp_path: Path) -> None:
    """A stand-in `/v1/responses` that records the bodies and answers non-streamed, each response
    with a fresh id: turn 0 goes whole, later turns name the previous id, all with the priority."""
    bodies: list[dict[str, Any]] = []
    ids = itertools.count()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def responses(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        text = {"type": "output_text", "text": "fine"}
        message = {"type": "message", "id": "msg", "role": "assistant", "content": [text]}
        return web.json_response(
            {
                "id": f"resp_{next(ids)}",
                "object": "response",
                "status": "completed",
                "output": [message],
                "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/responses", responses)

    async def go() -> LevelResult:
        async with serving(app) as url, aiohttp.ClientSession() as http:
            target = Target(label="t", url=url, model="m")
            opts = RequestOptions(
                endpoint="responses", max_tokens=8, stream=False, chain_responses=True, priorities=(10, 0)
            )
            dataset = load_dataset("sessions", max_turns=3)
            return await run_level(http, target, dataset, LevelSpec(concurrency=1, num_prompts=3), opts)

    result = asyncio.run(go())
    assert result.level.failed == 0 and len(bodies) == 9  # 3 sessions of 3 turns, one after the other
    assert [b["priority"] for b in bodies] == [10] * 3 + [0] * 3 + [10] * 3
    assert [("previous_response_id" in b) for b in bodies] == [False, True, True] * 3
    assert [r.priority for r in result.records] == [10] * 3 + [0] * 3 + [10] * 3
    assert result.level.priorities == {"0": 3, "10": 6}


def test_a_twin_takes_it_on_every_endpoint(twin_factory: Any) -> None:
    """The twins (SGLang's request shapes) accept the field on chat, completions and responses."""
    url = twin_factory("k26-ar", "--enable-response-store")

    async def go(endpoint: str) -> LevelResult:
        async with aiohttp.ClientSession() as http:
            target = Target(label="t", url=url, model="kimi-k2.6")
            opts = RequestOptions(endpoint=endpoint, max_tokens=4, thinking="off", priorities=(0, 10))
            chain = endpoint == "responses"
            if chain:
                opts = msgspec.structs.replace(opts, chain_responses=True)
            dataset = load_dataset("sessions", max_turns=2) if chain else load_dataset("chat")
            return await run_level(http, target, dataset, LevelSpec(concurrency=2, num_prompts=2), opts)

    for endpoint in ("chat", "completions", "responses"):
        result = asyncio.run(go(endpoint))
        assert result.level.failed == 0, (endpoint, result.level.errors)
        assert [p.priority for p in result.level.by_priority] == [0, 10]


# ---------------------------------------------------------------------- through a real gateway


@pytest.fixture(scope="module")
def capped_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A twin behind a gateway that admits one request at a time: everything else waits in its
    queue, ordered by priority (higher first)."""
    with one_slot_gateway(tmp_path_factory.mktemp("priority-gw"), TEST_TIME_SCALE, 120) as (_twin, url, proc):
        yield url, proc


def test_the_high_class_jumps_the_gateways_queue(
    capped_gateway: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Closed loop at 6 in flight over a cap of 1: five requests always wait. Request indices
    alternate 0, 10, so every freed slot finds a priority-10 waiter about every other time and
    takes it first, while the 0s queue behind each of them: a 10 waits for about one request, a 0
    for several. The medians compare queue positions, whatever one request takes on this machine."""
    url, proc = capped_gateway
    out = tmp_path / "run"
    cmd = loadgen(
        "--target", url, "--concurrency", "6", "--num-prompts", "40", "--priority", "0,10",
        "--max-tokens", "64", "--dataset", "chat", "--thinking", "off",
        "--output", str(out), "--no-plots", "--no-progress", "--timeout", "120",
    )  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr + run.stdout
    assert "per priority" in run.stdout
    lv = load_summary(out).runs[0].levels[0]
    assert lv.failed == 0 and lv.priorities == {"0": 20, "10": 20}
    low, high = lv.by_priority
    assert (low.priority, low.completed, high.priority, high.completed) == (0, 20, 10, 20)
    assert high.median_ttft_ms is not None and low.median_ttft_ms is not None
    print(
        f"priority 10: TTFT p50 {high.median_ttft_ms:.1f} p99 {high.p99_ttft_ms:.1f} ms; "
        f"priority 0: TTFT p50 {low.median_ttft_ms:.1f} p99 {low.p99_ttft_ms:.1f} ms"
    )
    assert high.median_ttft_ms < low.median_ttft_ms
    # the cause, from the gateway's own access log: the 10s waited less in its queue
    ids = {r.request_id: r.priority for r in _records(out)}

    def served() -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in output(proc).splitlines() if x.startswith('{"ts"')]
        return [r for r in lines if r.get("request_id") in ids]

    assert wait_until(lambda: len(served()) == 40)
    waits: dict[int, list[float]] = {0: [], 10: []}
    for r in served():
        assert r.get("priority") == ids[r["request_id"]]
        waits[r["priority"]].append(r.get("queue_s", 0.0))
    mean = {p: sum(w) / len(w) for p, w in waits.items()}
    print(f"mean queue_s: priority 10 {mean[10] * 1000:.1f} ms, priority 0 {mean[0] * 1000:.1f} ms")
    assert mean[10] < mean[0]
