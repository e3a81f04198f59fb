"""The twin's request priority, SGLang 0.5.23's semantics (`managers/scheduler.py`,
`managers/schedule_policy.py`, `managers/tokenizer_manager.py`, `arg_groups/fields/schedule.py`).

Engine-level (the queue's order, eviction, preemption, retraction):
tests/unit/test_sim_priority_engine.py. Over HTTP, real twin processes with
`--max-running-requests 1`: requests queued behind a stream that holds the slot start one at a
time, so the order in which their first bytes arrive is the order the queue served them (no clock
involved); the 503s a client sees on every route, streamed and not; the flags' startup warnings
and `/server_info`; `priority` type errors as pydantic and the /generate contract report them.
"""

from __future__ import annotations

import http.client
import importlib
import json
import select
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_sim_server import SCALE, twin
from tests.support import free_port, output, running, specroute, wait_until
from tests.unit.test_sim_priority_engine import QUEUED
from twin.engine import (
    PREEMPTED_MESSAGE,
    PRIORITY_DISABLED_MESSAGE,
    QUEUE_FULL_MESSAGE,
)

MODEL = "kimi-k2.6"
MSG = [{"role": "user", "content": "Write a long history of the Roman republic."}]
LONG = 100_000  # tokens: a stream that holds its slot until its client leaves
I64 = 1 << 63


def _answer(req: urllib.request.Request) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str) -> tuple[int, Any]:
    return _answer(urllib.request.Request(url))


def post(url: str, body: Any) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    return _answer(urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}))


# ------------------------------------------------------------------------------ engine


# --------------------------------------------------------------------------------- HTTP


def _chat(priority: Any = None, *, stream: bool = False, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": MSG, "max_tokens": max_tokens, "stream": stream, **extra}
    if priority is not None:
        body["priority"] = priority
    return body


class Pending:
    """A request sent and not read yet: its response waits on the socket."""

    def __init__(self, url: str, path: str, body: dict[str, Any]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})

    def wait_started(self) -> None:
        readable, _, _ = select.select([self.conn.sock], [], [], 60)
        assert readable, "no response"

    def response(self) -> tuple[int, bytes]:
        resp = self.conn.getresponse()
        return resp.status, resp.read()

    def close(self) -> None:
        self.conn.close()


def _frames(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for frame in raw.decode().split("\n\n"):
        if frame:
            assert frame.startswith("data: "), frame
            payload = frame[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _load(url: str) -> dict[str, Any]:
    load: dict[str, Any] = get(f"{url}/v1/loads")[1]["loads"][0]
    return load


def _waiting(url: str, n: int) -> None:
    assert wait_until(lambda: _load(url)["num_waiting_reqs"] == n), _load(url)


def _next_started(pending: dict[str, Pending]) -> str:
    """The one queued request whose response has begun (the one the queue admitted)."""
    by_sock = {p.conn.sock: name for name, p in pending.items()}
    readable, _, _ = select.select(list(by_sock), [], [], 60)
    assert len(readable) == 1, [by_sock[s] for s in readable]
    return by_sock[readable[0]]


def _hold(url: str, priority: int | None) -> Pending:
    holder = Pending(url, "/v1/chat/completions", _chat(priority, stream=True, max_tokens=LONG))
    holder.wait_started()
    return holder


@pytest.mark.parametrize(
    "flags,path,holder,expected",
    [
        (["--enable-priority-scheduling"], "/v1/chat/completions", 100, "bdcea"),
        (
            ["--enable-priority-scheduling", "--schedule-low-priority-values-first"],
            "/v1/completions",
            -100,
            "ecbda",
        ),
        (["--enable-priority-scheduling", "--default-priority-value", "3"], "/v1/chat/completions", 100, "bdace"),
        ([], "/v1/chat/completions", 100, "abcde"),  # off: first come, first served
    ],
    ids=["high-first", "low-first", "default-value", "off"],
)
def test_queued_requests_start_in_priority_order(flags: list[str], path: str, holder: int, expected: str) -> None:
    with twin("k26-ar", "--max-running-requests", "1", *flags) as url:
        current = _hold(url, holder)
        pending: dict[str, Pending] = {}
        for i, (name, priority) in enumerate(QUEUED):
            body: dict[str, Any] = (
                _chat(priority, stream=True, max_tokens=LONG)
                if path == "/v1/chat/completions"
                else {"model": MODEL, "prompt": "hi", "max_tokens": LONG, "stream": True, "priority": priority}
            )
            pending[name] = Pending(url, path, body)
            _waiting(url, i + 1)  # arrival order is the order sent
        order = ""
        while pending:
            current.close()  # the client leaves: its slot goes to the next in the queue
            name = _next_started(pending)
            order += name
            current = pending.pop(name)
        current.close()
        assert order == expected


def _victim(url: str, route: str, stream: bool) -> Pending:
    if route == "chat":
        return Pending(url, "/v1/chat/completions", _chat(0, stream=stream, stream_options={"include_usage": True}))
    if route == "completions":
        return Pending(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "stream": stream, "priority": 0})
    if route == "generate":
        return Pending(url, "/generate", {"text": "hi", "stream": stream, "priority": 0})
    # Responses: SGLang does not forward `priority`, so the request has the least preferred one
    return Pending(url, "/v1/responses", {"model": MODEL, "input": "hi", "stream": stream, "priority": 0})


def _check_aborted(route: str, stream: bool, status: int, raw: bytes, message: str) -> None:
    """What SGLang's client sees for a scheduler abort with status 503 on each route."""
    flat = {"object": "error", "message": message, "type": "503", "param": None, "code": 503}
    frame = {"error": {**flat, "type": "SERVICE_UNAVAILABLE"}}
    if route == "responses":
        if not stream:  # the HTTPException is caught by `create_responses`' generic handler
            error = {"message": f"503: {message}", "type": "invalid_request_error", "param": None, "code": 400}
            assert (status, json.loads(raw)) == (400, {"error": error})
            return
        events = [json.loads(line[len("data: ") :]) for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert status == 200 and [ev["type"] for ev in events][-1] == "response.failed"
        assert events[-1]["response"]["error"]["message"] == message
        return
    if not stream:
        assert (status, json.loads(raw)) == (503, flat)
        return
    assert status == 200
    frames = _frames(raw)
    assert frames[-1] == "[DONE]"
    if route == "generate":
        (out, _) = frames
        assert out["text"] == "" and out["output_ids"] == []
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "abort", "status_code": 503, "message": message}
        assert meta["completion_tokens"] == 0 and meta["weight_version"] == "default"
        return
    assert frames[0] == frame
    if route == "chat":  # include_usage: the abort's meta_info has no tokens
        usage = frames[1]
        assert usage["choices"] == [] and usage["object"] == "chat.completion.chunk"
        assert usage["usage"]["prompt_tokens"] == usage["usage"]["completion_tokens"] == 0
        assert len(frames) == 3
    else:
        assert len(frames) == 2


@pytest.mark.parametrize(
    "route,stream",
    [
        ("chat", False),
        ("chat", True),
        ("completions", True),
        ("generate", False),
        ("generate", True),
        ("responses", False),
        ("responses", True),
    ],
)
def test_a_full_queue_evicts_its_worst_waiter_for_a_better_request(route: str, stream: bool) -> None:
    flags = ("--enable-priority-scheduling", "--max-running-requests", "1", "--max-queued-requests", "1")
    with twin("k26-ar", *flags) as url:
        holder = _hold(url, 100)
        victim = _victim(url, route, stream)
        _waiting(url, 1)
        # not strictly better than the waiter: the arrival is refused itself (a Responses waiter has
        # the least preferred priority, which only that same value ties)
        tie = -I64 if route == "responses" else 0
        assert post(f"{url}/v1/chat/completions", _chat(tie)) == (503, _flat(QUEUE_FULL_MESSAGE))
        better = Pending(url, "/v1/chat/completions", _chat(1))
        status, raw = victim.response()
        _check_aborted(route, stream, status, raw, PREEMPTED_MESSAGE)
        assert _load(url)["num_waiting_reqs"] == 1  # the better one took the place
        holder.close()
        status, raw = better.response()
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    "path,stream", [("/v1/chat/completions", False), ("/v1/chat/completions", True), ("/v1/completions", True)]
)
def test_an_evicted_sample_of_a_parallel_request_ends_it(path: str, stream: bool) -> None:
    flags = ("--enable-priority-scheduling", "--max-running-requests", "2", "--max-queued-requests", "2")
    with twin("k26-ar", *flags) as url:
        holder = _hold(url, 100)
        body: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": LONG,
            "n": 2,
            "stream": stream,
            "priority": 0,
            "stream_options": {"include_usage": True},
        }
        body.update({"messages": MSG} if path == "/v1/chat/completions" else {"prompt": "hi"})
        parallel = Pending(url, path, body)
        # the warm-up has run; sample 0 holds the second slot, sample 1 waits
        assert wait_until(lambda: (_load(url)["num_running_reqs"], _load(url)["num_waiting_reqs"]) == (2, 1))
        filler = Pending(url, "/v1/chat/completions", _chat(5))  # the queue is full
        _waiting(url, 2)
        better = Pending(url, "/v1/chat/completions", _chat(1))  # better than sample 1 only
        status, raw = parallel.response()
        if not stream:
            assert (status, json.loads(raw)) == (503, _flat(PREEMPTED_MESSAGE))
        else:
            frames = _frames(raw)
            error = {"error": {**_flat(PREEMPTED_MESSAGE), "type": "SERVICE_UNAVAILABLE"}}
            assert status == 200 and frames[-3] == error and frames[-1] == "[DONE]"
            assert frames[:-3] and all(f["choices"][0]["index"] == 0 for f in frames[:-3])  # sample 0's chunks
            assert all(f["choices"][0]["finish_reason"] is None for f in frames[:-3])
            usage = frames[-2]["usage"]
            assert frames[-2]["choices"] == [] and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert wait_until(lambda: _load(url)["num_running_reqs"] == 1)  # sample 0 is gone too
        holder.close()
        assert filler.response()[0] == better.response()[0] == 200


def _flat(message: str, status: int = 503, err_type: str = "503") -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


@pytest.fixture(scope="module")
def strict_url() -> Iterator[str]:
    """A server that refuses priorities: priority scheduling off, --abort-on-priority-when-disabled."""
    with twin("k26-ar", "--abort-on-priority-when-disabled") as url:
        yield url


@pytest.mark.parametrize(
    "route,stream",
    [
        ("chat", False),
        ("chat", True),
        ("completions", False),
        ("completions", True),
        ("generate", False),
        ("generate", True),
    ],
)
def test_a_priority_sent_to_a_server_that_refuses_them_is_a_503(strict_url: str, route: str, stream: bool) -> None:
    victim = _victim(strict_url, route, stream)
    status, raw = victim.response()
    _check_aborted(route, stream, status, raw, PRIORITY_DISABLED_MESSAGE)


def test_a_refusing_server_serves_requests_without_a_priority(strict_url: str) -> None:
    status, body = post(f"{strict_url}/v1/chat/completions", _chat())
    assert status == 200 and body["usage"]["completion_tokens"] == 4
    assert post(f"{strict_url}/v1/chat/completions", {**_chat(), "priority": None})[0] == 200  # null: none
    # Responses: SGLang does not forward the field, so nothing is refused
    status, body = post(f"{strict_url}/v1/responses", {"model": MODEL, "input": "hi", "priority": 3})
    assert status == 200 and body["status"] in ("completed", "incomplete")
    # pydantic reads "5" as an integer: the request has a priority, and is refused
    assert post(f"{strict_url}/v1/chat/completions", _chat("5")) == (503, _flat(PRIORITY_DISABLED_MESSAGE))


def test_without_the_flag_a_priority_is_ignored() -> None:
    with twin("k26-ar") as url:
        status, body = post(f"{url}/v1/chat/completions", _chat(7))
        assert status == 200 and body["usage"]["completion_tokens"] == 4
        status, body = post(f"{url}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}, "priority": 7})
        assert status == 200 and body["meta_info"]["completion_tokens"] == 3


def _fastapi_error(err_type: str, msg: str, value: Any, endpoint: str) -> str:
    err = {"type": err_type, "loc": ("body", "priority"), "msg": msg, "input": value}
    return f"1 validation error:\n  {err}\n{endpoint} {[err]}"


CHAT_LINE = (
    '  File "sglang/srt/entrypoints/http_server.py", line 1870, in openai_v1_chat_completions\n'
    "    POST /v1/chat/completions"
)
GENERATE_LINE = '  File "sglang/srt/entrypoints/http_server.py", line 928, in generate_request\n    POST /generate'
NOT_INT = "Input should be a valid integer, unable to parse string as an integer"
FRACTION = "Input should be a valid integer, got a number with a fractional part"


def test_a_priority_of_the_wrong_type_is_refused_as_pydantic_refuses_it(strict_url: str) -> None:
    status, err = post(f"{strict_url}/v1/chat/completions", _chat("high"))
    assert (status, err) == (400, _flat(_fastapi_error("int_parsing", NOT_INT, "high", CHAT_LINE), 400, "Bad Request"))
    status, err = post(f"{strict_url}/v1/completions", {"model": MODEL, "prompt": "hi", "priority": 1.5})
    assert status == 400 and err["type"] == "Bad Request" and "int_from_float" in err["message"]
    assert "POST /v1/completions" in err["message"]
    status, err = post(f"{strict_url}/v1/chat/completions", {**_chat(stream=True), "priority": [1]})
    assert status == 400 and "int_type" in err["message"]  # before any stream starts
    status, err = post(f"{strict_url}/v1/responses", {"model": MODEL, "input": "hi", "priority": None})
    assert status == 400 and err["error"]["type"] == "Bad Request" and "int_type" in err["error"]["message"]


def test_generate_checks_priority_with_pydantic_then_the_json_contract(strict_url: str) -> None:
    body = {"text": "hi", "priority": "high"}
    expected = _flat(_fastapi_error("int_parsing", NOT_INT, "high", GENERATE_LINE), 400, "Bad Request")
    assert post(f"{strict_url}/generate", body) == (400, expected)
    # pydantic lets these through; the contract wants a JSON integer (`api/v1/api_types.py`)
    for value, shown in (("5", 'string "5"'), (True, "boolean `true`"), (5.0, "floating point `5.0`")):
        assert post(f"{strict_url}/generate", {"text": "hi", "priority": value}) == (
            400,
            {"error": f"invalid type: {shown}, expected i64"},
        )


def test_a_priority_beyond_64_bits_is_the_tokenizer_managers_value_error(strict_url: str) -> None:
    text = "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807"
    for value in (I64, -I64 - 1):
        assert post(f"{strict_url}/v1/chat/completions", _chat(value)) == (400, _flat(text, 400, "BadRequestError"))
        assert post(f"{strict_url}/generate", {"text": "hi", "priority": value}) == (400, {"error": {"message": text}})
    # the edges fit: refused by the server's policy, not by the range check
    assert post(f"{strict_url}/v1/chat/completions", _chat(I64 - 1))[0] == 503


def test_the_type_errors_are_sglangs_own_models_errors(strict_url: str) -> None:
    from pydantic import ValidationError

    # SGLang's protocol.py from the wheel the contract test downloads and caches (skipped, as there,
    # only when it is not cached and PyPI is unreachable); imported by name: not type-checked
    contract = importlib.import_module("tests.integration.test_sim_contract")
    protocol = contract.SGLang(contract._extract(contract._wheel())).protocol
    cases = [
        ("/v1/chat/completions", protocol.ChatCompletionRequest, _chat(), "flat"),
        ("/v1/completions", protocol.CompletionRequest, {"model": MODEL, "prompt": "hi"}, "flat"),
        ("/v1/responses", protocol.ResponsesRequest, {"model": MODEL, "input": "hi"}, "nested"),
    ]
    for path, model, body, shape in cases:
        for value in ("high", 2.5, [1], {"a": 1}, "1e3"):
            with pytest.raises(ValidationError) as exc:
                model.model_validate({**body, "priority": value})
            errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.value.errors(include_url=False)]
            status, err = post(f"{strict_url}{path}", {**body, "priority": value})
            message = err["message"] if shape == "flat" else err["error"]["message"]
            assert status == 400 and message.endswith(f" {errors}"), (path, value, message)
            assert message.startswith(f"1 validation error:\n  {errors[0]}\n")


def test_preemption_retracts_a_running_request_for_one_better_by_more_than_the_threshold() -> None:
    with twin("k26-ar", "--enable-priority-scheduling", "--max-running-requests", "1") as url:
        low = _hold(url, 0)
        mid = Pending(url, "/v1/chat/completions", _chat(10, stream=True, max_tokens=LONG))
        _waiting(url, 1)  # better by 10, not above the threshold: it waits
        high = Pending(url, "/v1/chat/completions", _chat(11, stream=True, max_tokens=LONG))
        high.wait_started()  # it got the slot: the low one went back to the queue
        _waiting(url, 2)
        assert _load(url)["num_running_reqs"] == 1
        assert _drain(low) > 0  # what it streamed before it was retracted
        high.close()
        assert _next_started({"mid": mid, "low": low}) == "mid"  # mid (10) before low (0)
        mid.close()
        assert _next_started({"low": low}) == "low"  # the low stream resumes
        low.close()


def _drain(p: Pending) -> int:
    """Bytes available on the socket now (a stream's frames so far)."""
    n = 0
    sock = p.conn.sock
    while select.select([sock], [], [], 0.05)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            break
        n += len(chunk)
    return n


def test_no_preemption_with_disable_priority_preemption_over_http() -> None:
    flags = ("--enable-priority-scheduling", "--disable-priority-preemption", "--max-running-requests", "1")
    with twin("k26-ar", *flags) as url:
        low = _hold(url, 0)
        high = Pending(url, "/v1/chat/completions", _chat(1000, stream=True, max_tokens=LONG))
        for _ in range(5):  # several steps later it still waits
            assert _load(url)["num_waiting_reqs"] == 1
        assert not select.select([high.conn.sock], [], [], 0)[0]
        low.close()
        high.wait_started()
        high.close()


# ------------------------------------------------------------------------- flags and info


PRIORITY_ARGS = (
    "enable_priority_scheduling",
    "disable_priority_preemption",
    "default_priority_value",
    "abort_on_priority_when_disabled",
    "schedule_low_priority_values_first",
    "priority_scheduling_preemption_threshold",
)


def _serve(*flags: str) -> tuple[dict[str, Any], str]:
    """/server_info's priority fields and what the process printed, for a twin with `flags`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute("sim", "--profile", "k26-ar", "--port", str(port), "--time-scale", SCALE, *flags)
    with running(cmd, ready_url=f"{url}/ready") as proc:
        info = get(f"{url}/server_info")[1]
        return {k: info[k] for k in PRIORITY_ARGS}, output(proc)


def test_server_info_reports_the_priority_args_and_startup_warns_as_sglang() -> None:
    info, printed = _serve()
    assert info == {
        "enable_priority_scheduling": False,
        "disable_priority_preemption": False,
        "default_priority_value": None,
        "abort_on_priority_when_disabled": False,
        "schedule_low_priority_values_first": False,
        "priority_scheduling_preemption_threshold": 10,
    }
    assert "warning" not in printed
    flags = ("--enable-priority-scheduling", "--schedule-low-priority-values-first")
    info, printed = _serve(
        *flags, "--priority-scheduling-preemption-threshold", "-2", "--abort-on-priority-when-disabled"
    )
    assert info["enable_priority_scheduling"] and info["schedule_low_priority_values_first"]
    assert info["abort_on_priority_when_disabled"] and info["priority_scheduling_preemption_threshold"] == -2
    assert "--default-priority-value is not set while --enable-priority-scheduling is enabled." in printed
    info, printed = _serve("--default-priority-value", "-4", "--disable-priority-preemption")
    assert info["default_priority_value"] == -4 and info["disable_priority_preemption"]
    assert "--disable-priority-preemption has no effect without --enable-priority-scheduling" in printed
    assert "--default-priority-value has no effect without --enable-priority-scheduling" in printed


@pytest.mark.parametrize("flag", ["--default-priority-value", "--priority-scheduling-preemption-threshold"])
def test_a_priority_flag_that_is_not_an_integer_is_a_one_line_error(flag: str) -> None:
    out = subprocess.run(specroute("sim", "--profile", "k26-ar", flag, "x"), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "invalid int value: 'x'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
