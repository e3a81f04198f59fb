"""End to end with the real `openai` SDK against `specroute serve` and its twin backends."""

from __future__ import annotations

import json
import time
import urllib.request

import openai
import pytest

from tests.support import free_port, open_stream, running, specroute

MSG = [{"role": "user", "content": "Natalia sold clips to 48 friends and then half as many. How many in total?"}]
# The K2.6 twins think first (kimi_k2 reasoning parser): the relay tests ask for the answer alone, in `content`.
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}


@pytest.fixture(scope="module")
def client(gateway_url):
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0, timeout=30)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post_raw(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_lists_one_entry_per_served_model(client):
    ids = sorted(m.id for m in client.models.list().data)
    assert ids == ["kimi-k2.6", "qwen3.6-27b"]


def test_chat_completion_non_stream(client):
    raw = client.chat.completions.with_raw_response.create(
        model="kimi-k2.6", messages=MSG, max_tokens=12, extra_body=NO_THINKING
    )
    completion = raw.parse()
    assert raw.http_response.status_code == 200
    assert raw.headers["x-specroute-backend"] in {"k26-ar", "k26-eagle3", "k26-dflash"}
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.usage.completion_tokens == 12 and completion.choices[0].finish_reason == "length"
    # the gateway asked speculative backends for spec details; the client did not, so none leak
    assert "sglext" not in (completion.model_extra or {})


def test_the_readme_quickstart_streams_reasoning_then_the_answer(client):
    """`specroute serve --twins` runs its K2.6 twins as K2.6 is deployed, with the kimi_k2 reasoning
    and tool-call parsers: the README quickstart's stream, read as it reads it, thinks in
    `reasoning_content` chunks first, then answers in `content`."""
    question = "A train leaves at 9:40 and arrives at 13:05. How long is the trip?"
    kinds = []
    for chunk in client.chat.completions.create(
        model="kimi-k2.6", stream=True, messages=[{"role": "user", "content": question}]
    ):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta and getattr(delta, "reasoning_content", None):
            kinds.append("reasoning")
        elif delta and delta.content:
            kinds.append("content")
    assert kinds.count("reasoning") > 1 and kinds.count("content") > 1, kinds
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")  # thinks, then answers


def test_chat_stream_relays_sglang_order(client):
    stream = client.chat.completions.create(
        model="kimi-k2.6",
        messages=MSG,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_THINKING,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finish_at = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason)
    assert chunks[finish_at].choices[0].finish_reason == "length"
    # after the finish chunk: only the usage chunk the client asked for (no sglext it did not ask for)
    tail = chunks[finish_at + 1 :]
    assert len(tail) == 1 and tail[0].choices == [] and tail[0].usage.completion_tokens == 20
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) >= 20 - 1


def test_stream_without_usage_request_gets_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(model="qwen3.6-27b", messages=MSG, max_tokens=8, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completions_non_stream_and_stream(client):
    done = client.completions.create(model="qwen3.6-27b", prompt="def fib(n):", max_tokens=10)
    assert done.choices[0].text and done.usage.completion_tokens == 10
    chunks = list(client.completions.create(model="qwen3.6-27b", prompt="def fib(n):", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_spec_details_pass_through_when_the_client_asks(client):
    completion = client.chat.completions.create(
        model="kimi-k2.6@k26-dflash", messages=MSG, max_tokens=32, extra_body={"return_spec_tokens_details": True}
    )
    details = completion.model_extra["sglext"]["spec_tokens_details"]
    assert details["spec_verify_ct"] > 0
    assert details["spec_accept_length"] == pytest.approx(32 / details["spec_verify_ct"], rel=1e-3)


def test_pin_by_model_suffix_and_by_header(client):
    raw = client.chat.completions.with_raw_response.create(model="kimi-k2.6@k26-eagle3", messages=MSG, max_tokens=4)
    assert raw.headers["x-specroute-backend"] == "k26-eagle3"
    raw = client.chat.completions.with_raw_response.create(
        model="kimi-k2.6", messages=MSG, max_tokens=4, extra_headers={"x-specroute-backend": "k26-ar"}
    )
    assert raw.headers["x-specroute-backend"] == "k26-ar"
    same = {"x-specroute-backend": "k26-eagle3"}  # both ways, naming one backend: fine
    raw = client.chat.completions.with_raw_response.create(
        model="kimi-k2.6@k26-eagle3", messages=MSG, max_tokens=4, extra_headers=same
    )
    assert raw.headers["x-specroute-backend"] == "k26-eagle3"
    with pytest.raises(openai.BadRequestError) as info:  # two backends: which one is a guess
        client.chat.completions.create(
            model="kimi-k2.6@k26-eagle3", messages=MSG, max_tokens=4, extra_headers={"x-specroute-backend": "k26-ar"}
        )
    assert info.value.param == "model" and "'k26-eagle3'" in str(info.value) and "'k26-ar'" in str(info.value)


def test_unknown_model_and_unknown_pin_are_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MSG)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="kimi-k2.6@qwen36-ddtree-b15", messages=MSG)


def test_missing_field_is_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="kimi-k2.6", messages=[])
    assert info.value.param == "messages"


@pytest.mark.parametrize(
    "body,param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "kimi-k2.6", "messages": [{"role": "user", "content": "\xff"}]}', None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "kimi-k2.6", "messages": "hi"}', "messages"),
        (b'{"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}', "max_tokens"),
        (b'{"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hi"}], "stream": "maybe"}', "stream"),
    ],
)
def test_bad_bodies_are_400_in_openai_shape(gateway_url, body, param):
    status, data = _post_raw(f"{gateway_url}/v1/chat/completions", body)
    assert status == 400
    assert set(data["error"]) == {"message", "type", "param", "code"} and data["error"]["param"] == param


def test_a_body_sglang_converts_is_routed_and_answered_as_sglang_reads_it(gateway_url):
    """pydantic's lax mode (FastAPI's default) reads "true" as true and "6" or 2.0 as integers:
    the gateway streams this body, with two samples of 6 tokens, and usage it was asked for."""
    body = {
        "model": "kimi-k2.6",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": "6",
        "stream": "true",
        "stream_options": {"include_usage": "true"},
        "n": 2.0,
        "temperature": "0",
    }
    req = urllib.request.Request(
        f"{gateway_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        frames = [f[len("data: ") :] for f in r.read().decode().split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert {c["index"] for chunk in chunks for c in chunk["choices"]} == {0, 1}
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_upstream_validation_error_is_translated_with_its_status(client):
    # The gateway passes SGLang extras through unchecked; SGLang refuses return_meta_info on a
    # stream with a flat 400 body, which the client must see in OpenAI's nested shape.
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="kimi-k2.6", messages=MSG, max_tokens=4, stream=True, extra_body={"return_meta_info": True}
        )
    assert info.value.status_code == 400 and "return_meta_info" in info.value.message
    assert set(info.value.response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics", "/v1/models"])
def test_head_on_a_probe_route_is_its_get_without_the_body(gateway_url, path):
    import http.client

    host, port = gateway_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)
    got = conn.getresponse()
    body = got.read()
    conn.request("HEAD", path)  # the same connection: a body after HEAD would corrupt the next answer
    head = conn.getresponse()
    assert head.read() == b"" and head.status == got.status
    assert head.getheader("content-type") == got.getheader("content-type")
    if path != "/metrics":  # the scrape's counters move between the two
        assert int(head.getheader("content-length")) == len(body)
    conn.request("GET", "/health")
    assert conn.getresponse().read() == b'{"status":"ok"}'
    conn.close()


def test_unknown_route_and_wrong_method(gateway_url):
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{gateway_url}/v1/nothing", timeout=5)
    assert info.value.code == 404 and "error" in json.loads(info.value.read())
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{gateway_url}/v1/chat/completions", timeout=5)
    assert info.value.code == 405 and "error" in json.loads(info.value.read())


def _inflight(gateway_url: str) -> dict[str, int]:
    return {b["name"]: b["inflight"] for b in _get(f"{gateway_url}/admin/backends")["backends"]}


def _wait_inflight_zero(gateway_url: str, timeout: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        counts = _inflight(gateway_url)
        if not any(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def test_client_disconnect_mid_stream_releases_the_inflight_slot(gateway_url):
    with open_stream(gateway_url, {"model": "kimi-k2.6@k26-ar", "messages": MSG, "max_tokens": 2000, "stream": True}):
        assert _inflight(gateway_url)["k26-ar"] == 1
    assert _wait_inflight_zero(gateway_url) == {k: 0 for k in _inflight(gateway_url)}


def test_relay_is_chunk_for_chunk_what_the_backend_sent(gateway_url):
    backends = {b["name"]: b["url"] for b in _get(f"{gateway_url}/admin/backends")["backends"]}
    body = {
        "model": "kimi-k2.6",
        "messages": MSG,
        "max_tokens": 24,
        "stream": True,
        "seed": 7,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
        **NO_THINKING,
    }

    def events(url: str, payload: dict) -> list[dict]:
        req = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            lines = [line for line in r.read().decode().split("\n\n") if line.strip()]
        return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]" for line in lines]

    def strip(evs):
        return [{k: v for k, v in e.items() if k not in ("id", "created")} if isinstance(e, dict) else e for e in evs]

    def text(evs):
        return "".join(
            e["choices"][0]["delta"].get("content") or "" for e in evs if isinstance(e, dict) and e.get("choices")
        )

    # AR chunking is deterministic (one token per step): the relayed stream has the backend's exact
    # event sequence, field for field, except the per-request id and timestamp.
    via_gateway = strip(events(gateway_url, {**body, "model": "kimi-k2.6@k26-ar"}))
    direct = strip(events(backends["k26-ar"], body))
    for e in via_gateway + direct:
        if isinstance(e, dict):
            for c in e.get("choices", []):
                c.get("delta", {}).pop("content", None)  # words are random; counts and order are not
    assert via_gateway == direct
    # Speculative: several tokens per chunk; sglext then usage then [DONE], as SGLang orders them.
    spec = events(gateway_url, {**body, "model": "kimi-k2.6@k26-dflash"})
    assert spec[-1] == "[DONE]" and "sglext" in spec[-3] and spec[-3]["choices"] == []
    assert spec[-2]["usage"]["completion_tokens"] == 24 and spec[-2]["choices"] == []
    assert spec[-4]["choices"][0]["finish_reason"] == "length"
    assert len(text(spec).split()) == 24
    content_chunks = [e for e in spec[:-3] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(content_chunks) < 24  # some chunk carried more than one token


def test_model_is_rewritten_to_the_backends_served_name(twin_factory, tmp_path):
    twin = twin_factory("k26-ar", "--served-model-name", "moonshotai/Kimi-K2.6")
    config = tmp_path / "c.toml"
    port = free_port()
    config.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{port}"\n[[backends]]\nname = "only"\nurl = "{twin}"\n'
        f'model = "kimi"\nserved_name = "moonshotai/Kimi-K2.6"\n'
    )
    with running(specroute("serve", "--config", str(config)), ready_url=f"http://127.0.0.1:{port}/health"):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        completion = client.chat.completions.create(model="kimi", messages=MSG, max_tokens=3)
    # SGLang echoes the request's model: seeing the served name proves the gateway rewrote it.
    assert completion.model == "moonshotai/Kimi-K2.6"


def test_unreachable_backend_is_502_in_openai_shape(tmp_path):
    port, dead = free_port(), free_port()
    config = tmp_path / "c.toml"
    # slow health checks: the request reaches the dead backend before the poller takes it out
    config.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{port}"\n[[backends]]\nname = "dead"\n'
        f'url = "http://127.0.0.1:{dead}"\nmodel = "m"\n[health]\ninterval_s = 60\n'
    )
    with running(specroute("serve", "--config", str(config)), ready_url=f"http://127.0.0.1:{port}/health"):
        status, data = _post_raw(
            f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps({"model": "m", "messages": MSG}).encode()
        )
    assert status == 502 and "unreachable" in data["error"]["message"]


def test_a_model_is_retrieved_with_the_context_length_every_backend_allows(tmp_path, twin_factory):
    """`models.retrieve` (GET /v1/models/{id}); `max_model_len` is the smallest the backends' model
    cards report: a request sized to it fits wherever it lands."""
    from tests.support import gateway, get_json, wait_until

    short = twin_factory("k26-ar", "--context-length", "131072")
    full = twin_factory("k26-dflash")
    backends = [
        {"name": "short", "url": short, "model": "kimi-k2.6", "strategy": "ar"},
        {"name": "full", "url": full, "model": "kimi-k2.6", "strategy": "dflash"},
    ]
    cards = [get_json(f"{u}/v1/models")["data"][0]["max_model_len"] for u in (short, full)]
    assert cards[0] < cards[1]  # the flag took: the twins differ
    assert get_json(f"{short}/server_info")["context_length"] == cards[0]
    assert get_json(f"{full}/server_info")["context_length"] is None  # as SGLang: only the override
    with gateway(tmp_path, backends) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        # both cards read (the poller reads each backend's once, after its /server_info)
        assert wait_until(lambda: client.models.retrieve("kimi-k2.6").model_extra["max_model_len"] == min(cards))
        card = client.models.retrieve("kimi-k2.6")
        assert card.id == "kimi-k2.6" and card.model_extra["max_model_len"] == min(cards)
        assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [min(cards)]
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve("moonshotai/Kimi-K2.6")
        assert e.value.body["code"] == "model_not_found" and "'moonshotai/Kimi-K2.6'" in e.value.body["message"]
