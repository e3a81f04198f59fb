"""`loadgen --endpoint responses --chain-responses`: session turns stored on the server, each turn
after the first sent as `previous_response_id` plus its new user message. The body, the id the
reader keeps, the option and its errors (chained sessions against real twins and through the
gateway: tests/integration/test_loadgen_response_chain_runs.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadgen.cli import build_parser, main, plan_from_args
from loadgen.client import RequestOptions, Target, build_body
from loadgen.datasets import Message, Prompt
from loadgen.responses import ResponsesStreamParser, parse_full

CHAINED = RequestOptions(endpoint="responses", max_tokens=24, thinking="off", chain_responses=True)


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
