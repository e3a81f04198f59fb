"""Chained Responses sessions run for real: against twins that keep (or do not keep) the stored
responses, and through a gateway that keeps a chain where its history is (the body and the
option: tests/unit/test_loadgen_response_chain.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.request
from typing import Any

import aiohttp
import msgspec
import pytest

from loadgen.client import RequestOptions
from loadgen.datasets import load_dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.summary import RequestRecord
from loadgen.targets import resolve
from tests.support import gateway
from tests.unit.test_loadgen_response_chain import CHAINED

MODEL = "kimi-k2.6"


def _level(url: str, opts: RequestOptions, sessions: int = 3, max_turns: int | None = None) -> LevelResult:
    async def run() -> LevelResult:
        async with aiohttp.ClientSession() as http:
            target = await resolve(http, url, gateway_url=url, model=MODEL, api_key=None)
            dataset = load_dataset("sessions", max_turns=max_turns)
            return await run_level(http, target, dataset, LevelSpec(concurrency=2, num_prompts=sessions), opts)

    return asyncio.run(run())


def _by_session(records: list[RequestRecord]) -> dict[int | None, list[RequestRecord]]:
    out: dict[int | None, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: (r.session or 0, r.turn or 0)):
        out.setdefault(r.session, []).append(r)
    return out


@pytest.fixture(scope="module")
def stored(twin_factory: Any) -> str:
    url: str = twin_factory("k26-ar", "--enable-response-store")
    return url


@pytest.mark.parametrize("stream", [True, False])
def test_chained_sessions_keep_their_history_on_the_server(stored: str, stream: bool) -> None:
    result = _level(stored, msgspec.structs.replace(CHAINED, stream=stream))
    want = sum(len(s.turns) for s in load_dataset("sessions").take_sessions(3))
    assert (result.level.completed, result.level.failed) == (want, 0)
    sessions = _by_session(result.records)
    assert len(sessions) == 3
    for recs in sessions.values():
        assert [r.turn for r in recs] == list(range(len(recs))) and len(recs) > 1
        assert all(r.ok and r.response_id and r.response_id.startswith("resp_") for r in recs)
        assert recs[0].previous_response_id is None
        for before, r in itertools.pairwise(recs):
            assert r.previous_response_id == before.response_id  # chained to the turn before
            # the server prepended the stored turns: the prompt grows, and its prefix is cached
            assert (r.input_tokens or 0) > (before.input_tokens or 0)
            assert (r.cached_tokens or 0) > 0
        # what the server stored for the last turn: the chain, as it received it
        last = recs[-1]
        with urllib.request.urlopen(f"{stored}/v1/responses/{last.response_id}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["id"] == last.response_id and body["previous_response_id"] == recs[-2].response_id
        assert body["store"] is True


def test_without_the_response_store_the_chained_turn_fails_and_ends_its_session(twin_factory: Any) -> None:
    url = twin_factory("k26-ar")
    result = _level(url, CHAINED, sessions=2)
    sessions = _by_session(result.records)
    assert len(sessions) == 2 and (result.level.completed, result.level.failed) == (2, 2)
    for recs in sessions.values():
        first, second = recs  # the failed turn 1 ends the session
        assert first.ok and first.response_id and first.previous_response_id is None
        assert not second.ok and second.error == "http_400" and second.previous_response_id == first.response_id
        assert (second.error_detail or "").startswith("Response store is disabled")


def test_chained_sessions_through_the_gateway_stay_where_their_history_is(tmp_path: Any, twin_factory: Any) -> None:
    backends = [
        {"name": name, "url": twin_factory(f"k26-{kind}", "--enable-response-store"), "model": MODEL, "strategy": kind}
        for name, kind in (("a", "dflash"), ("b", "eagle3"))
    ]
    with gateway(tmp_path, backends, gateway_keys='policy = "round_robin"\n') as url:
        result = _level(url, CHAINED, sessions=3, max_turns=3)
    assert (result.level.completed, result.level.failed) == (9, 0)
    sessions = _by_session(result.records)
    assert len(sessions) == 3
    for recs in sessions.values():
        assert [r.turn for r in recs] == [0, 1, 2] and all(r.ok for r in recs)
        assert all(r.previous_response_id == b.response_id for b, r in itertools.pairwise(recs))
        assert len({r.backend for r in recs}) == 1  # every follow-up went to the backend holding its history
    assert {r.backend for r in result.records} == {"a", "b"}  # round robin spread the first turns
