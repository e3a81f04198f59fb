"""Native SGLang routes of the twin (/generate, /abort_request, /metrics) and the 0.5.9 mode."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.integration.test_sim_server import CHAT, get, post, sse, twin
from tests.support import free_port, running, specroute

SPEC_FIELDS = {
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
}


def _start(profile: str, *extra: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(
        specroute("sim", "--profile", profile, "--port", str(port), "--time-scale", "0.02", *extra),
        ready_url=f"{url}/ready",
    ):
        yield url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _start("k26-dflash", "--enable-metrics")


@pytest.fixture(scope="module")
def legacy_url() -> Iterator[str]:
    yield from _start("k26-dflash", "--compat", "0.5.9")


def test_generate_non_stream_meta_info(url):
    status, body = post(f"{url}/generate", {"text": "Solve 2 + 2", "sampling_params": {"max_new_tokens": 20}})
    assert status == 200
    assert len(body["output_ids"]) == 20 and len(body["text"].split()) == 20
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 20}
    assert meta["completion_tokens"] == 20 and meta["prompt_tokens"] >= 1
    assert meta["e2e_latency"] > 0 and "cached_tokens" in meta
    assert set(meta) >= SPEC_FIELDS
    assert meta["spec_accept_length"] == pytest.approx(20 / meta["spec_verify_ct"])


def test_generate_default_max_new_tokens_and_input_ids(url):
    _, body = post(f"{url}/generate", {"input_ids": [1, 2, 3]})
    assert body["meta_info"]["completion_tokens"] == 128
    assert body["meta_info"]["prompt_tokens"] == 3


def test_generate_stream_is_cumulative(url):
    events = sse(f"{url}/generate", {"text": "Solve 2 + 2", "sampling_params": {"max_new_tokens": 30}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert len(texts[-1].split()) == 30
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [len(c["output_ids"]) for c in chunks]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert "spec_verify_ct" not in chunks[0]["meta_info"]  # spec stats only when finished
    assert set(chunks[-1]["meta_info"]) >= SPEC_FIELDS


def test_generate_incremental_streaming_output():
    with twin("k26-ar", "--incremental-streaming-output") as u:
        events = sse(f"{u}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 6}})
        chunks = events[:-1]
        assert [len(c["output_ids"]) for c in chunks] == [1] * 6
        assert "spec_verify_ct" not in chunks[-1]["meta_info"]  # AR: no spec stats


def test_generate_errors_are_native_shape(url):
    status, body = post(f"{url}/generate", {"sampling_params": {"max_new_tokens": 3}})
    assert status == 400 and isinstance(body["error"], str)
    status, body = post(f"{url}/generate", {"text": "x", "sampling_params": {"max_new_tokens": "a"}})
    assert status == 400 and "max_new_tokens" in body["error"]


def test_return_meta_info_chat(url):
    status, body = post(f"{url}/v1/chat/completions", {**CHAT, "return_meta_info": True})
    assert status == 200
    meta = body["choices"][0]["meta_info"]
    assert meta["completion_tokens"] == CHAT["max_tokens"]
    assert set(meta) >= SPEC_FIELDS
    status, err = post(f"{url}/v1/chat/completions", {**CHAT, "return_meta_info": True, "stream": True})
    assert status == 400 and err["object"] == "error" and err["param"] == "return_meta_info"


def test_metrics_names(url):
    post(f"{url}/v1/chat/completions", CHAT)
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:spec_verify_calls_total",
        "sglang:generation_tokens_total",
        "sglang:prompt_tokens_total",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_sum",
    ):
        assert name in text, name
    gen_total = next(ln for ln in text.splitlines() if ln.startswith("sglang:generation_tokens_total{"))
    assert float(gen_total.rsplit(" ", 1)[1]) >= CHAT["max_tokens"]


def test_metrics_absent_without_flag(legacy_url):
    status, _ = get(f"{legacy_url}/metrics")
    assert status == 404


def test_abort_request_ends_stream_with_abort(url):
    result: dict = {}

    def consume() -> None:
        result["events"] = sse(f"{url}/v1/chat/completions", {**CHAT, "max_tokens": 100000, "rid": "abort-me"})

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.monotonic() + 10
    while get(f"{url}/v1/loads")[1]["loads"][0]["num_running_reqs"] < 1:
        assert time.monotonic() < deadline, "request never started"
        time.sleep(0.01)
    req = urllib.request.Request(
        f"{url}/abort_request",
        data=json.dumps({"rid": "abort-me"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    t.join(20)
    events = result["events"]
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "abort"


# --------------------------------------------------------------- older 0.5.x imitation


def test_compat_mode_imitates_older_sglang(legacy_url):
    _, info = get(f"{legacy_url}/server_info")
    assert info["version"] == "0.5.9"
    status, _ = get(f"{legacy_url}/v1/loads")
    assert status == 404
    status, load = get(f"{legacy_url}/get_load")
    assert status == 200 and isinstance(load, list) and "num_reqs" in load[0]
    _, body = post(f"{legacy_url}/v1/chat/completions", {**CHAT, "return_spec_tokens_details": True})
    assert "sglext" not in body and body["usage"]["completion_tokens"] == CHAT["max_tokens"]
    events = sse(f"{legacy_url}/v1/chat/completions", {**CHAT, "return_spec_tokens_details": True})
    assert not any(isinstance(e, dict) and "sglext" in e for e in events)
    _, gen = post(f"{legacy_url}/generate", {"text": "x", "sampling_params": {"max_new_tokens": 9}})
    meta = gen["meta_info"]
    assert meta["spec_verify_ct"] > 0 and "spec_accept_histogram" in meta
    assert "spec_tokens_details" not in meta


def test_new_version_has_no_get_load(url):
    status, _ = get(f"{url}/get_load")
    assert status == 404
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{url}/no/such/route", timeout=5)


def test_generate_value_errors_are_the_tokenizer_managers_shape():
    """What SGLang's tokenizer manager refuses with a ValueError (the context length,
    SamplingParams.verify) `serve_generate_request` answers 400 `{"error": {"message"}}`, or, streamed,
    HTTP 200 with one error frame and [DONE]; only contract errors are `{"error": "<text>"}`."""
    long = {"text": "word " * 400, "sampling_params": {"max_new_tokens": 8}}
    with twin("k26-ar", "--context-length", "64") as u:
        status, body = post(f"{u}/generate", long)
        assert status == 400 and "context length" in body["error"]["message"]
        events = sse(f"{u}/generate", {**long, "stream": True})
        assert events[-1] == "[DONE]" and events[0]["error"]["code"] == 400 and events[0]["error"]["retryable"] is False
        status, body = post(f"{u}/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}})
        assert status == 400 and body["error"]["message"] == "max_new_tokens must be at least 0, got -1."
