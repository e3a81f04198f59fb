"""`loadgen --endpoint responses --chain-responses`: session turns stored on the server, each turn
after the first sent as `previous_response_id` plus its new user message. The body and the id the
reader keeps, then chained sessions against real twins started with `--enable-response-store`
(and one without it), and through the gateway, which must send each follow-up to the backend that
stored its previous response."""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.request
from typing import Any

import aiohttp
import msgspec
import pytest

from loadgen.cli import build_parser, main, plan_from_args
from loadgen.client import RequestOptions, Target, build_body
from loadgen.datasets import Message, Prompt, load_dataset
from loadgen.driver import LevelResult, LevelSpec, run_level
from loadgen.responses import ResponsesStreamParser, parse_full
from loadgen.summary import RequestRecord
from loadgen.targets import resolve
from tests.support import gateway

CHAINED = RequestOptions(endpoint="responses", max_tokens=24, thinking="off", chain_responses=True)
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


# ------------------------------------------------------------------------ body and reader


def test_a_chained_body_names_the_previous_response_and_sends_only_the_new_turn() -> None:
    target = Target(label="t", url="http://h", model="m")
    prompt = Prompt(messages=(Message("user", "and then?"),), domain="chat")
    body = json.loads(build_body(target, prompt, CHAINED, store=True, previous_response_id="resp_1"))
    assert body["store"] is True and body["previous_response_id"] == "resp_1"
    assert body["input"] == [{"role": "user", "content": "and then?"}]
    first = json.loads(build_body(target, prompt, CHAINED, store=True))
    assert first["store"] is True and "previous_response_id" not in first
    plain = json.loads(build_body(target, prompt, CHAINED))  # not a session turn: as before
    assert plain["store"] is False and "previous_response_id" not in plain


def test_the_reader_keeps_the_response_id_in_the_answer() -> None:
    finished: dict[str, Any] = {"id": "resp_a", "status": "completed", "output": []}
    created = {"type": "response.created", "response": {**finished, "status": "in_progress"}}
    done = {"type": "response.completed", "response": finished}
    p = ResponsesStreamParser(keep_answer=True)
    p.feed(b"event: response.created\ndata: " + json.dumps(created).encode() + b"\n\n", 0.0)
    assert p.answer is not None and p.answer.response_id == "resp_a"
    p.feed(b"data: " + json.dumps(done).encode() + b"\n\n", 1.0)
    assert p.outcome() == (None, None) and p.answer.response_id == "resp_a"
    whole = ResponsesStreamParser(keep_answer=True)
    assert parse_full(json.dumps({**finished, "id": "resp_b"}).encode(), whole, 1.0) is None
    assert whole.answer is not None and whole.answer.response_id == "resp_b"


# ---------------------------------------------------------------------------- against twins


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


@pytest.mark.parametrize(
    "args, message",
    [
        (("--dataset", "sessions"), "--chain-responses needs --endpoint responses"),
        (("--endpoint", "responses", "--dataset", "math"), "--chain-responses needs a session dataset"),
    ],
)
def test_argument_errors_exit_2(args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "http://127.0.0.1:9", "--chain-responses", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"loadgen: error: {message}") and "\n" not in err


def test_the_option_reaches_the_request_options() -> None:
    args = ["--target", "http://127.0.0.1:9", "--endpoint", "responses", "--dataset", "sessions", "--chain-responses"]
    assert plan_from_args(build_parser().parse_args(args)).opts.chain_responses is True
    assert plan_from_args(build_parser().parse_args(args[:-1])).opts.chain_responses is False


# -------------------------------------------------------------------------- through the gateway


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
