"""The twin's `/v1/responses` (SGLang 0.5.23's Responses API, the common subset) over real HTTP,
with the real openai SDK: the response object and its usage, the reasoning item before the
message, the streamed events in SGLang's order (numbered, no `[DONE]`), the nested error envelope,
`--enable-response-store` (retrieve, `previous_response_id` hitting the prefix cache, background,
cancel), a full queue, and a disconnect aborting the engine request. Shapes are checked against
the openai package's pydantic types (SGLang builds its output from them).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.integration.test_sim_server import _start, get, post, twin
from tests.support import wait_until
from twin.domain import classify, prompt_key
from twin.profile import load_profile
from twin.responses_output import ResponseEvents
from twin.state import ResponseStore
from twin.text import render_chat
from twin.thinking import reasoning_tokens

SERVED = "kimi-k2.6"
NO_THINK = {"effort": "none"}
LONG_INPUT = "Tell me about the history of speculative decoding in large language models. " * 8
DISABLED = (
    "Response store is disabled. Stateful Responses require --enable-response-store on a standalone"
    " server; response storage is unavailable in PD mode."
)
_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A thinking DFlash twin that splits reasoning and keeps responses."""
    yield from _start("k26-dflash", "--reasoning-parser", "kimi_k2", "--enable-response-store")


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    """No reasoning parser, no response store (SGLang's default)."""
    yield from _start("k26-ar")


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def _reasoning_len(text: str, instructions: str | None = None) -> int:
    """Reasoning tokens the twin's K2.6 spends on a one-message input (`</think>` included)."""
    turns = ([("system", instructions)] if instructions else []) + [("user", text)]
    conversation = render_chat(turns)
    return reasoning_tokens(load_profile("k26-dflash").reasoning, classify(conversation), prompt_key(conversation))


def events(url: str, body: dict[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """POST a streamed request: the (event, data) pairs, and the raw text."""
    req = urllib.request.Request(
        f"{url}/v1/responses",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    out = []
    for frame in raw.split("\n\n"):
        if not frame:
            continue
        head, data = frame.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: "), frame
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == head[len("event: ") :]
        out.append((payload["type"], payload))
    return out, raw


def _loads(url: str) -> dict[str, Any]:
    loads: dict[str, Any] = get(f"{url}/v1/loads")[1]["loads"][0]
    return loads


def _open_stream(url: str, body: dict[str, Any]) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST", "/v1/responses", body=json.dumps({**body, "stream": True}), headers={"Content-Type": "application/json"}
    )
    return conn


def _read_until(resp: http.client.HTTPResponse, event_type: str) -> None:
    while True:
        line = resp.readline()
        assert line, "stream ended"
        if line.decode().strip() == f"event: {event_type}":
            return


def _error(status_body: tuple[int, Any], status: int, message: str, param: str | None, err_type: str) -> None:
    got_status, body = status_body
    assert got_status == status, body
    assert body == {"error": {"message": message, "type": err_type, "param": param, "code": status}}


# ------------------------------------------------------------------------- non-streamed


def test_response_object_with_reasoning_then_message(url):
    text = "What is a good name for a cat?"
    r = _reasoning_len(text)
    status, body = post(f"{url}/v1/responses", {"model": SERVED, "input": text, "max_output_tokens": r + 8})
    assert status == 200
    Response.model_validate(body)
    assert list(body) == [
        "id",
        "object",
        "created_at",
        "model",
        "output",
        "status",
        "usage",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "previous_response_id",
        "reasoning",
        "store",
        "temperature",
        "text",
        "top_p",
        "truncation",
        "user",
        "metadata",
    ]
    assert body["id"].startswith("resp_") and len(body["id"]) == 37 and body["object"] == "response"
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["summary"] == [] and reasoning["encrypted_content"] is None and reasoning["status"] == "completed"
    assert len(reasoning["content"][0]["text"].split()) == r - 1  # </think> is not reasoning text
    assert message["type"] == "message" and message["role"] == "assistant" and message["phase"] == "final_answer"
    assert message["content"][0]["type"] == "output_text" and message["content"][0]["annotations"] == []
    assert len(message["content"][0]["text"].split()) == 6  # max_output_tokens less SGLang's 2 of headroom
    # the twin's answers run to their budget: finish "length", so SGLang's status is incomplete
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"] == {
        "input_tokens": body["usage"]["input_tokens"],
        "input_tokens_details": {
            "cached_tokens": body["usage"]["input_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": r + 6,
        "output_tokens_details": {"reasoning_tokens": r},
        "total_tokens": body["usage"]["input_tokens"] + r + 6,
    }
    assert body["text"] is None  # a reasoning item makes the output not "text only"
    assert body["reasoning"] == {"effort": None, "summary": None} and body["metadata"] == {}
    assert body["store"] is True and body["truncation"] == "disabled" and body["tool_choice"] == "auto"


def test_sdk_create_without_thinking(url):
    client = _client(url)
    resp = client.responses.create(
        model=SERVED,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=12,
        reasoning=NO_THINK,
        temperature=0.5,
        top_p=0.9,
        metadata={"k": "v"},
    )
    assert [item.type for item in resp.output] == ["message"]
    assert len(resp.output_text.split()) == 10
    assert resp.usage is not None and resp.usage.output_tokens == 10
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.instructions == "Be brief." and resp.temperature == 0.5 and resp.top_p == 0.9
    assert resp.metadata == {"k": "v"} and resp.max_output_tokens == 12
    assert resp.text is not None and resp.text.format is not None and resp.text.format.type == "text"


def test_reasoning_parser_off_keeps_reasoning_in_the_message(plain_url):
    text = "Tell me a joke."
    turns = [("user", text)]
    conversation = render_chat(turns)
    r = reasoning_tokens(load_profile("k26-ar").reasoning, classify(conversation), prompt_key(conversation))
    status, body = post(f"{plain_url}/v1/responses", {"model": SERVED, "input": text, "max_output_tokens": r + 5})
    assert status == 200
    (message,) = body["output"]
    assert message["type"] == "message" and "</think>" in message["content"][0]["text"]
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


# ----------------------------------------------------------------------------- streamed


def test_stream_events_in_sglang_order(url):
    text = "Name three colours."
    r = _reasoning_len(text)
    evs, raw = events(url, {"model": SERVED, "input": text, "max_output_tokens": r + 7})
    for _, payload in evs:
        _EVENT.validate_python(payload)
    assert "[DONE]" not in raw
    assert [p["sequence_number"] for _, p in evs] == list(range(len(evs)))
    kinds = [k for k, _ in evs]
    head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[:4] == head
    n_reason = kinds.count("response.reasoning_text.delta")
    n_text = kinds.count("response.output_text.delta")
    assert n_reason >= 1 and n_text >= 1
    expected = (
        head
        + ["response.reasoning_text.delta"] * n_reason
        + ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
        + ["response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * n_text
        + ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
        + ["response.incomplete"]
    )
    assert kinds == expected
    created = evs[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    final = evs[-1][1]["response"]
    assert final["id"] == created["id"]
    Response.model_validate(final)
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    deltas = "".join(p["delta"] for k, p in evs if k == "response.output_text.delta")
    assert final["output"][1]["content"][0]["text"] == deltas and len(deltas.split()) == 5
    reasoning = "".join(p["delta"] for k, p in evs if k == "response.reasoning_text.delta")
    assert final["output"][0]["content"][0]["text"] == reasoning
    assert final["usage"]["output_tokens"] == r + 5 and final["usage"]["output_tokens_details"]["reasoning_tokens"] == r
    message_added = evs[kinds.index("response.output_item.added", 3)][1]
    assert message_added["output_index"] == 1 and message_added["item"]["status"] == "in_progress"


def test_stream_reasoning_summary_events(url):
    text = "Name three colours."
    r = _reasoning_len(text)
    evs, _ = events(url, {"model": SERVED, "input": text, "max_output_tokens": r + 4, "reasoning": {"summary": "auto"}})
    kinds = [k for k, _ in evs]
    assert kinds[3] == "response.reasoning_summary_part.added"
    assert "response.reasoning_text.delta" not in kinds and "response.reasoning_summary_text.delta" in kinds
    final = evs[-1][1]["response"]
    reasoning = final["output"][0]
    assert reasoning["summary"] == [{"text": reasoning["content"][0]["text"], "type": "summary_text"}]
    assert final["reasoning"] == {"effort": "medium", "summary": None}


def test_sdk_stream(url):
    client = _client(url)
    with client.responses.create(
        model=SERVED, input="Say hi.", max_output_tokens=10, reasoning=NO_THINK, stream=True
    ) as stream:
        got = list(stream)
    assert got[0].type == "response.created" and got[-1].type == "response.incomplete"
    text = "".join(e.delta for e in got if e.type == "response.output_text.delta")
    assert len(text.split()) == 8
    assert got[-1].response.output_text == text


def test_disconnect_aborts_the_engine_request(url):
    conn = _open_stream(url, {"model": SERVED, "input": "Write a long story.", "max_output_tokens": 100000})
    resp = conn.getresponse()
    assert resp.status == 200
    _read_until(resp, "response.reasoning_text.delta")  # generating
    assert _loads(url)["num_running_reqs"] >= 1
    conn.close()
    assert wait_until(lambda: _loads(url)["num_running_reqs"] == 0)


# ------------------------------------------------------------------------------- errors


def test_errors_in_the_responses_envelope(url):
    u = f"{url}/v1/responses"
    status, body = post(u, {"model": SERVED})
    assert status == 400 and body["error"]["type"] == "Bad Request" and body["error"]["code"] == 400
    assert "input" in body["error"]["message"] and body["error"]["param"] is None
    status, body = post(u, b"{not json", "application/json")
    assert status == 400 and body["error"]["type"] == "Bad Request"
    status, body = post(u, {"model": SERVED, "input": "x", "reasoning": {"effort": "huge"}})
    assert status == 400 and body["error"]["type"] == "Bad Request"
    _error(
        post(u, {"model": "nope", "input": "x"}),
        404,
        "The model 'nope' does not exist",
        "model",
        "invalid_request_error",
    )
    _error(
        post(u, {"model": SERVED, "input": "x", "background": True, "store": False}),
        400,
        "background=true requires store=true.",
        "store",
        "invalid_request_error",
    )
    _error(
        post(u, {"model": SERVED, "input": "x", "previous_response_id": "resp_unknown"}),
        404,
        "Response with id 'resp_unknown' not found.",
        "response_id",
        "invalid_request_error",
    )
    _error(
        post(u, {"model": SERVED, "input": "x", "previous_response_id": "abc"}),
        400,
        "Invalid 'response_id': 'abc'. Expected an ID that begins with 'resp'.",
        "response_id",
        "invalid_request_error",
    )
    _error(
        post(u, {"model": SERVED, "input": [{"type": "item_reference", "id": "x"}]}),
        400,
        "Unsupported Responses API input item type: 'item_reference' None",
        None,
        "invalid_request_error",
    )
    _error(
        post(u, {"model": SERVED, "input": "x", "stream": True, "include": ["message.output_text.logprobs"]}),
        400,
        "logprobs are not supported in streaming mode",
        "logprobs",
        "invalid_request_error",
    )
    # the router's own 404 is starlette's HTTPException, which SGLang's handler (fastapi's) misses
    status, body = get(f"{url}/v1/responses/resp_x/nothing")
    assert status == 404 and body == {"detail": "Not Found"}


def test_context_length_exceeded(url):
    body = {"model": SERVED, "input": "x", "max_output_tokens": 300000}
    status, err = post(f"{url}/v1/responses", body)
    assert status == 400 and err["error"]["type"] == "invalid_request_error" and err["error"]["code"] == 400
    assert err["error"]["message"].startswith("Requested token count exceeds the model's maximum context length")
    # streamed: the stream is open before generation is asked for, so it ends with response.failed
    evs, raw = events(url, body)
    assert [k for k, _ in evs] == ["response.created", "response.in_progress", "response.failed"]
    failed = evs[-1][1]["response"]
    assert failed["status"] == "failed" and failed["usage"] is None and failed["output"] == []
    assert failed["error"]["code"] == "server_error" and failed["error"]["message"] == err["error"]["message"]
    assert "[DONE]" not in raw


def test_store_disabled_refuses_stateful_requests(plain_url):
    client = _client(plain_url)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=SERVED, input="x", previous_response_id="resp_abc")
    assert e.value.body == {
        "message": DISABLED,
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": 400,
    }
    _error(
        post(f"{plain_url}/v1/responses", {"model": SERVED, "input": "x", "background": True}),
        400,
        DISABLED,
        "background",
        "invalid_request_error",
    )
    for status_body in (
        get(f"{plain_url}/v1/responses/resp_abc"),
        post(f"{plain_url}/v1/responses/resp_abc/cancel", {}),
    ):
        _error(status_body, 400, DISABLED, "response_id", "invalid_request_error")


def test_queue_full():
    with twin("k26-ar", "--max-running-requests", "1", "--max-queued-requests", "1", "--enable-response-store") as url:
        long = {"model": SERVED, "input": "Write a long story.", "max_output_tokens": 100000, "reasoning": NO_THINK}
        a = _open_stream(url, long)
        resp_a = a.getresponse()
        _read_until(resp_a, "response.output_text.delta")  # a is running
        b = _open_stream(url, long)
        b.getresponse()
        assert wait_until(lambda: _loads(url)["num_waiting_reqs"] == 1)
        short = {"model": SERVED, "input": "x", "max_output_tokens": 8}
        # not streamed: SGLang's generic handler catches the HTTPException(503): 400, "503: ..."
        _error(
            post(f"{url}/v1/responses", short), 400, "503: The request queue is full.", None, "invalid_request_error"
        )
        evs, _ = events(url, short)
        assert [k for k, _ in evs] == ["response.created", "response.in_progress", "response.failed"]
        failed = evs[-1][1]["response"]
        assert failed["error"] == {"code": "server_error", "message": "The request queue is full."}
        assert failed["usage"]["output_tokens"] == 0
        assert get(f"{url}/v1/responses/{failed['id']}")[1]["status"] == "failed"  # stored
        a.close()
        b.close()
        assert wait_until(lambda: _loads(url)["num_running_reqs"] == 0 and _loads(url)["num_waiting_reqs"] == 0)


# -------------------------------------------------------------------------------- store


def test_retrieve_and_chain_hits_the_prefix_cache(url):
    client = _client(url)
    first = client.responses.create(model=SERVED, input=LONG_INPUT, max_output_tokens=20, reasoning=NO_THINK)
    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    second = client.responses.create(
        model=SERVED, input="And after that?", previous_response_id=first.id, max_output_tokens=20, reasoning=NO_THINK
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    # the second prompt repeats the first turn (its input, then its output)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    third = client.responses.create(
        model=SERVED, input="And then?", previous_response_id=second.id, max_output_tokens=20, reasoning=NO_THINK
    )
    assert third.usage is not None
    assert third.usage.input_tokens_details.cached_tokens > second.usage.input_tokens_details.cached_tokens


def test_store_false_is_not_kept(url):
    status, body = post(f"{url}/v1/responses", {"model": SERVED, "input": "x", "max_output_tokens": 4, "store": False})
    assert status == 200 and body["store"] is False
    assert get(f"{url}/v1/responses/{body['id']}")[0] == 404


def test_stream_is_stored(url):
    evs, _ = events(url, {"model": SERVED, "input": "hi", "max_output_tokens": 6, "reasoning": NO_THINK})
    final = evs[-1][1]["response"]
    assert get(f"{url}/v1/responses/{final['id']}") == (200, final)


def test_background_completes_and_cancel(url):
    u = f"{url}/v1/responses"
    status, queued = post(
        u, {"model": SERVED, "input": "hi", "max_output_tokens": 8, "reasoning": NO_THINK, "background": True}
    )
    assert status == 200 and queued["status"] == "queued" and queued["output"] == [] and queued["usage"] is None
    assert wait_until(lambda: get(f"{u}/{queued['id']}")[1]["status"] == "incomplete")
    done = get(f"{u}/{queued['id']}")[1]
    assert done["usage"]["output_tokens"] == 6 and done["output"][0]["type"] == "message"
    # a terminal response is returned as it is
    assert post(f"{u}/{queued['id']}/cancel", {}) == (200, done)
    # a long one is cancelled while it runs: status cancelled, the engine request aborted
    status, queued = post(u, {"model": SERVED, "input": "story", "max_output_tokens": 100000, "background": True})
    assert status == 200
    assert wait_until(lambda: _loads(url)["num_running_reqs"] == 1)
    status, cancelled = post(f"{u}/{queued['id']}/cancel", {})
    assert status == 200 and cancelled["status"] == "cancelled" and cancelled["output"] == []
    assert wait_until(lambda: _loads(url)["num_running_reqs"] == 0)
    assert get(f"{u}/{queued['id']}")[1]["status"] == "cancelled"
    _error(
        post(f"{u}/resp_missing/cancel", {}),
        404,
        "Response with id 'resp_missing' not found.",
        "response_id",
        "invalid_request_error",
    )


# --------------------------------------------------------------------------- unit level


def test_store_is_bounded_oldest_first():
    store = ResponseStore(limit=2)
    for rid in ("resp_a", "resp_b", "resp_c"):
        store.put(rid, {"id": rid}, [rid])
    assert store.get("resp_a") is None and store.messages("resp_a") == []
    assert store.get("resp_c") == {"id": "resp_c"} and store.messages("resp_b") == ["resp_b"]
    assert len(store) == 2


def test_held_message_events_are_released_before_the_terminal_event():
    ev = ResponseEvents(summary=False, hold_message=True)
    assert ev.step("", " a") == b""
    out = ev.close() + ev.lifecycle("completed", {})
    kinds = [line.split(" ", 1)[1] for line in out.decode().split("\n") if line.startswith("event: ")]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_model_omitted(url):
    """SGLang builds the response with `model=request.model`: None fails pydantic after generating."""
    status, body = post(f"{url}/v1/responses", {"input": "x", "max_output_tokens": 4})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("1 validation error for ResponsesResponse\nmodel\n")
    req = urllib.request.Request(
        f"{url}/v1/responses",
        data=json.dumps({"input": "x", "max_output_tokens": 4, "background": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 500 and e.value.read() == b"Internal Server Error"


def test_tools_are_echoed_and_hold_the_message_until_the_end(url):
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    evs, _ = events(
        url, {"model": SERVED, "input": "hi", "max_output_tokens": 6, "reasoning": NO_THINK, "tools": [tool]}
    )
    kinds = [k for k, _ in evs]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * kinds.count("response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = evs[-1][1]["response"]
    assert final["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": None,
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
            "tools": None,
            "defer_loading": None,
            "format": None,
        }
    ]


def test_sampling_errors_are_the_generations(url):
    """SGLang checks sampling values when generation is asked for (`SamplingParams.verify`): a 400
    `invalid_request_error` unstreamed; streamed, the stream is already open and ends failed."""
    body = {"model": SERVED, "input": "x", "temperature": -1}
    status, err = post(f"{url}/v1/responses", body)
    assert status == 400 and err["error"]["type"] == "invalid_request_error"
    assert "temperature must be" in err["error"]["message"]
    evs, _ = events(url, {**body, "top_p": 0.5})
    assert [k for k, _ in evs] == ["response.created", "response.in_progress", "response.failed"]
    assert evs[-1][1]["response"]["error"] == {"code": "server_error", "message": err["error"]["message"]}
