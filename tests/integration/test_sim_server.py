"""The twin as a real process on loopback: endpoint shapes, stream order, errors, queueing."""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support import SIM_PROFILES, free_port, running, specroute
from twin.info_api import wall_clock_counters

SCALE = "0.02"


def _start(profile: str, *extra: str) -> Iterator[str]:
    """Yield the URL of a twin process for the duration of the generator (fixtures)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute("sim", "--profile", profile, "--port", str(port), "--time-scale", SCALE, *extra)
    with running(cmd, ready_url=f"{url}/ready"):
        yield url


twin = contextlib.contextmanager(_start)


@pytest.fixture(scope="module")
def spec_url() -> Iterator[str]:
    yield from _start("k26-dflash")


@pytest.fixture(scope="module")
def ar_url() -> Iterator[str]:
    yield from _start("k26-ar")


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else None


def post(url: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def sse(url: str, body: dict) -> list[Any]:
    """POST a streaming request; return the decoded `data:` payloads ("[DONE]" kept as str)."""
    req = urllib.request.Request(
        url, data=json.dumps({**body, "stream": True}).encode(), headers={"Content-Type": "application/json"}
    )
    out: list[Any] = []
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    for frame in raw.split("\n\n"):
        if not frame:
            continue
        assert frame.startswith("data: "), frame
        payload = frame[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


CHAT = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "Solve 3x + 5 = 11"}], "max_tokens": 24}


# ------------------------------------------------------------------------------- CLI


def test_list_prints_every_profile():
    out = subprocess.run(specroute("sim", "--list"), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    lines = out.stdout.strip().splitlines()
    names = {ln.split()[0] for ln in lines}
    assert names >= SIM_PROFILES
    row = next(ln.split() for ln in lines if ln.startswith("k26-dflash "))
    assert row[1] == "dflash" and row[2] == "kimi-k2.6"


@pytest.mark.parametrize(
    "args",
    [
        ["--profile", "nope"],
        ["--port", "x", "--profile", "k26-ar"],
        ["--port", "70000", "--profile", "k26-ar"],
        ["--bogus"],
        [],
        ["--profile", "k26-ar", "--ddtree-budget", "8"],
        ["--profile", "k26-ar", "--time-scale", "-1"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args):
    out = subprocess.run(specroute("sim", *args), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


# ------------------------------------------------------------------------ info routes


def test_models(spec_url):
    status, body = get(f"{spec_url}/v1/models")
    assert status == 200 and body["object"] == "list"
    (m,) = body["data"]
    assert m["id"] == "kimi-k2.6" and m["object"] == "model" and m["owned_by"] == "sglang"
    assert {"created", "root", "max_model_len"} <= set(m)


def test_server_info_speculative_and_ar(spec_url, ar_url):
    for path in ("/server_info", "/get_server_info"):
        status, info = get(spec_url + path)
        assert status == 200
        for key in (
            "speculative_algorithm",
            "speculative_draft_model_path",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "speculative_dflash_block_size",
            "max_running_requests",
            "attention_backend",
            "served_model_name",
            "tp_size",
            "version",
            "internal_states",
        ):
            assert key in info, key
        assert info["speculative_algorithm"] == "DFLASH"
        assert info["max_running_requests"] == 48
        assert info["served_model_name"] == "kimi-k2.6"
        st = info["internal_states"][0]
        assert {"effective_max_running_requests_per_dp", "last_gen_throughput"} <= set(st)
    _, ar = get(f"{ar_url}/server_info")
    assert ar["speculative_algorithm"] is None
    # SGLang sets it only from the flag or its speculative hooks: null on AR without the flag
    assert ar["max_running_requests"] is None
    assert ar["internal_states"][0]["effective_max_running_requests_per_dp"] > 48
    assert "avg_spec_accept_length" not in ar["internal_states"][0]


def test_model_info(spec_url):
    for path in ("/model_info", "/get_model_info"):
        status, info = get(spec_url + path)
        assert status == 200
        assert {"model_path", "served_model_name", "is_generation"} <= set(info)


def test_loads_core_and_spec_sections(spec_url, ar_url):
    # 300 tokens at ~4 per step: more than 40 decode steps, so the lifetime average is published
    post(f"{spec_url}/v1/chat/completions", {**CHAT, "max_tokens": 300})
    status, body = get(f"{spec_url}/v1/loads")
    assert status == 200 and {"timestamp", "version", "loads"} <= set(body)
    assert isinstance(body["timestamp"], str) and "T" in body["timestamp"]  # ISO-8601
    load = body["loads"][0]
    for key in (
        "timestamp",
        "dp_rank",
        "num_running_reqs",
        "num_waiting_reqs",
        "num_used_tokens",
        "max_total_num_tokens",
        "max_running_requests",
        "token_usage",
        "gen_throughput",
        "cache_hit_rate",
        "utilization",
        "speculative",
        "queues",
    ):
        assert key in load, key
    assert set(load["speculative"]) == {"accept_length", "accept_rate"}
    assert 2 < load["speculative"]["accept_length"] < 8
    steps, batch, step_us, _, _, generated = load["decode_moments"]  # scheduler.py's six sums
    assert steps >= 1 and batch >= steps and step_us > 0
    assert 2 < generated / batch < 8  # tokens per verify pass, the accept length again
    _, only_spec = get(f"{spec_url}/v1/loads?include=spec")
    assert "num_running_reqs" in only_spec["loads"][0]  # core keys are always there
    assert "speculative" in only_spec["loads"][0] and "queues" not in only_spec["loads"][0]
    _, core = get(f"{spec_url}/v1/loads?include=core")
    assert "speculative" not in core["loads"][0]
    status, err = get(f"{spec_url}/v1/loads?include=bogus")
    assert status == 400 and err["code"] == 400 and "Invalid include sections" in err["message"]
    _, ar = get(f"{ar_url}/v1/loads")
    assert "speculative" not in ar["loads"][0]  # absent on AR servers


def test_a_time_scaled_twin_reports_its_duration_counters_on_the_wall_clock():
    """At `--time-scale F` the twin takes F x the simulated time, and /v1/loads says so: the counters
    that are durations (prefill busy time; the decode moments' step time and batch x step time) are
    multiplied by F, the counts are not. A real server's counters are wall-clock too."""
    moments = (100 / 4, 100.0, 100 * 10_000.0, 100 * 4.0, 100 * 40_000.0, 400.0)
    wall = wall_clock_counters(moments, 2_000_000, 0.25)
    # steps, batch sum, step us x F, batch^2, batch x us x F, generated
    assert wall["decode_moments"] == [25.0, 100.0, 250_000.0, 400.0, 1_000_000.0, 400.0]
    assert wall["total_prefill_busy_us"] == 500_000
    assert wall_clock_counters(moments, 2_000_000, 1.0) == {
        "total_prefill_busy_us": 2_000_000,
        "decode_moments": list(moments),
    }
    assert wall_clock_counters(None, 0, 0.25) == {"total_prefill_busy_us": 0, "decode_moments": None}


def test_health_ready(spec_url):
    for path in ("/health", "/health_generate", "/ready"):
        with urllib.request.urlopen(spec_url + path, timeout=10) as r:
            assert r.status == 200


# ------------------------------------------------------------------ OpenAI routes


def test_chat_non_stream_with_spec_details(spec_url):
    status, body = post(f"{spec_url}/v1/chat/completions", {**CHAT, "return_spec_tokens_details": True})
    assert status == 200
    assert len(body["id"]) == 32 and int(body["id"], 16) >= 0
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    assert len(choice["message"]["content"].split()) == 24
    usage = body["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + 24
    d = body["sglext"]["spec_tokens_details"]
    assert list(d) == [
        "spec_accept_rate",
        "spec_accept_length",
        "spec_cap_length",
        "spec_block_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_verify_ct",
        "spec_correct_drafts_histogram",
        "spec_cap_lens_histogram",
    ]
    assert d["spec_accept_length"] == pytest.approx(24 / d["spec_verify_ct"])
    hist = d["spec_correct_drafts_histogram"]
    assert sum(hist) == d["spec_verify_ct"]
    assert hist[-1] > 0  # grows only to the largest count seen


def test_sglext_only_when_requested(spec_url):
    _, body = post(f"{spec_url}/v1/chat/completions", CHAT)
    assert "sglext" not in body


def test_client_rid_becomes_id(spec_url):
    _, body = post(f"{spec_url}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3, "rid": "my-request-1"})
    assert body["id"] == "my-request-1"


def test_chat_stream_chunk_order(spec_url):
    events = sse(
        f"{spec_url}/v1/chat/completions",
        {**CHAT, "max_tokens": 40, "return_spec_tokens_details": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    role = chunks[0]["choices"][0]["delta"]
    assert role["role"] == "assistant" and role["content"] == ""
    usage_chunk, sglext_chunk, finish_chunk = chunks[-1], chunks[-2], chunks[-3]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 40
    assert sglext_chunk["choices"] == [] and "spec_tokens_details" in sglext_chunk["sglext"]
    assert finish_chunk["choices"][0]["finish_reason"] == "length"
    content = chunks[1:-3]
    assert all(c["object"] == "chat.completion.chunk" for c in content)
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    words = [len(c["choices"][0]["delta"]["content"].split()) for c in content]
    assert sum(words) == 40
    # speculation: some step carried several tokens; the first token came from prefill alone
    assert max(words) > 1 and words[0] == 1
    d = sglext_chunk["sglext"]["spec_tokens_details"]
    assert d["spec_verify_ct"] == len(content) - 1


def test_ar_stream_has_no_sglext_and_one_token_per_chunk(ar_url):
    events = sse(
        f"{ar_url}/v1/chat/completions",
        {**CHAT, "max_tokens": 10, "return_spec_tokens_details": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    assert not any("sglext" in c for c in events[:-1])
    content = events[1:-3]
    assert len(content) == 10
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 10
    _, body = post(f"{ar_url}/v1/chat/completions", {**CHAT, "return_spec_tokens_details": True})
    assert "sglext" not in body


def test_completion_stream_order(spec_url):
    events = sse(
        f"{spec_url}/v1/completions",
        {"model": "m", "prompt": "def f():", "max_tokens": 12, "return_spec_tokens_details": True},
    )
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and "sglext" in events[-2]
    # no separate finish chunk: the last text chunk carries finish_reason
    last = events[-3]["choices"][0]
    assert last["finish_reason"] == "length" and last["text"]
    assert all(c["choices"][0]["finish_reason"] is None for c in events[:-3])
    text = "".join(c["choices"][0]["text"] for c in events[:-2])
    assert len(text.split()) == 12
    assert all(c["object"] == "text_completion" for c in events[:-1])


def test_completion_defaults_to_16_tokens(spec_url):
    _, body = post(f"{spec_url}/v1/completions", {"model": "m", "prompt": "hello"})
    assert body["usage"]["completion_tokens"] == 16


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "path,body,needle",
    [
        ("/v1/chat/completions", {"model": "m"}, "messages"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "many"}, "max_tokens"),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_request_is_flat_400(spec_url, path, body, needle):
    status, err = post(spec_url + path, body)
    assert status == 400
    assert set(err) == {"object", "message", "type", "param", "code"}
    # request-schema errors: FastAPI's handler, type "Bad Request", param null
    assert err["object"] == "error" and err["code"] == 400 and err["param"] is None
    assert err["type"] == "Bad Request" and needle in err["message"]


def test_fields_are_converted_as_pydantics_lax_mode_converts_them_but_on_generate(spec_url):
    # FastAPI validates SGLang's OpenAI bodies in pydantic's lax mode
    body = {**CHAT, "max_tokens": "5", "n": 2.0, "temperature": "0", "ignore_eos": "true"}
    status, done = post(f"{spec_url}/v1/chat/completions", body)
    assert status == 200 and done["usage"]["completion_tokens"] == 10
    status, done = post(f"{spec_url}/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 3.0})
    assert status == 200 and done["usage"]["completion_tokens"] == 3
    status, err = post(f"{spec_url}/v1/chat/completions", {**CHAT, "max_tokens": 5.5})
    assert status == 400 and "max_tokens" in err["message"]
    # every spelling pydantic takes, and only those: "yes", " 5 ", true for an integer; not "1e1"
    body = {**CHAT, "max_tokens": " 4 ", "stream": "no", "ignore_eos": "yes", "n": True}
    status, done = post(f"{spec_url}/v1/chat/completions", {**body, "stream_options": {"include_usage": None}})
    assert status == 200 and done["usage"]["completion_tokens"] == 4
    status, err = post(f"{spec_url}/v1/chat/completions", {**CHAT, "max_tokens": "1e1"})
    assert status == 400 and "max_tokens" in err["message"]
    # `max_completion_tokens or max_tokens` (to_sampling_params): a 0 gives way
    status, done = post(
        f"{spec_url}/v1/chat/completions", {**CHAT, "max_completion_tokens": 0, "max_tokens": 7, "ignore_eos": True}
    )
    assert status == 200 and done["usage"]["completion_tokens"] == 7
    # /generate's JSON contract then wants JSON's own types (entrypoints/api_contract.py)
    status, _ = post(f"{spec_url}/generate", {"text": "x", "stream": "false"})
    assert status == 400
    status, err = post(f"{spec_url}/generate", {"text": "x", "sampling_params": {"ignore_eos": "true"}})
    assert status == 400 and err == {"error": 'invalid type: string "true", expected a boolean'}


@pytest.mark.parametrize("prompt", ["", [], [""]])
def test_completion_with_empty_prompt_is_400(spec_url, prompt):
    status, err = post(f"{spec_url}/v1/completions", {"model": "m", "prompt": prompt})
    assert status == 400 and err["message"] == "Prompt cannot be empty"
    assert err["type"] == "BadRequestError"


def test_non_json_content_type_and_malformed_json(spec_url):
    status, err = post(f"{spec_url}/v1/chat/completions", b"{}", content_type="text/plain")
    assert status == 400 and err["object"] == "error"
    status, err = post(f"{spec_url}/v1/chat/completions", b"{nope")
    assert status == 400 and err["code"] == 400


# ------------------------------------------------------------------------ openai SDK


def test_openai_sdk_chat_stream_and_completion(spec_url):
    client = openai.OpenAI(base_url=f"{spec_url}/v1", api_key="x")
    chat = client.chat.completions.create(
        model="kimi-k2.6", max_tokens=8, messages=[{"role": "user", "content": "hello"}]
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model="kimi-k2.6",
        max_tokens=20,
        stream=True,
        messages=[{"role": "user", "content": "hello"}],
        stream_options={"include_usage": True},
        extra_body={"return_spec_tokens_details": True},
    )
    text, usage, reasons = "", None, []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reasons.append(chunk.choices[0].finish_reason)
        if chunk.usage:
            usage = chunk.usage
    assert len(text.split()) == 20 and usage.completion_tokens == 20
    assert reasons[-1] == "length"
    comp = client.completions.create(model="kimi-k2.6", prompt="x", max_tokens=5)
    assert comp.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="kimi-k2.6", messages=[], max_tokens=2)


# ----------------------------------------------------------------- queueing, abort


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def _open_stream(url: str, path: str, body: dict) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", path, body=json.dumps({**body, "stream": True}), headers={"Content-Type": "application/json"})
    return conn


def test_queue_cap_answers_503_and_disconnect_frees_slot():
    with twin("k26-ar", "--max-running-requests", "1", "--max-queued-requests", "1") as url:
        long = {**CHAT, "max_tokens": 100000}
        a = _open_stream(url, "/v1/chat/completions", long)
        resp_a = a.getresponse()
        assert resp_a.status == 200
        resp_a.readline()  # first frame arrived: a is running
        b = _open_stream(url, "/v1/chat/completions", long)
        _wait_for(lambda: get(f"{url}/v1/loads")[1]["loads"][0]["num_waiting_reqs"] == 1)
        status, err = post(f"{url}/v1/chat/completions", CHAT)
        assert status == 503 and err["object"] == "error" and err["code"] == 503
        a.close()  # client disconnect aborts a; b gets the slot
        _wait_for(lambda: get(f"{url}/v1/loads")[1]["loads"][0]["num_waiting_reqs"] == 0)
        b.close()
        _wait_for(lambda: get(f"{url}/v1/loads")[1]["loads"][0]["num_running_reqs"] == 0)
        status, body = post(f"{url}/v1/chat/completions", {**CHAT, "max_tokens": 3})
        assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_ddtree_budget_override_is_reported():
    with twin("k26-ddtree", "--ddtree-budget", "16", "--served-model-name", "k2") as url:
        _, info = get(f"{url}/server_info")
        assert info["speculative_algorithm"] == "DDTREE"
        assert info["speculative_ddtree_budget"] == 16
        assert info["speculative_num_draft_tokens"] == 17
        assert info["served_model_name"] == "k2"
        assert get(f"{url}/v1/models")[1]["data"][0]["id"] == "k2"


@pytest.mark.parametrize(
    "path,body", [("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "m", "prompt": "hi"})]
)
def test_a_client_leaving_parallel_samples_frees_every_one(path, body):
    with twin("k26-dflash") as url:
        conn = _open_stream(url, path, {**body, "max_tokens": 100000, "n": 3})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.readline()  # the first frame: the samples are running
        _wait_for(lambda: get(f"{url}/v1/loads")[1]["loads"][0]["num_running_reqs"] == 3)
        conn.close()
        _wait_for(lambda: get(f"{url}/v1/loads")[1]["loads"][0]["num_running_reqs"] == 0)
