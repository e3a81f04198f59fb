"""The twin's multi-LoRA serving (SGLang 0.5.23 semantics) over real HTTP, with the real openai SDK.

Flags and their startup checks, the adapter cards of /v1/models (byte for byte against SGLang's
pydantic ModelList), /load_lora_adapter and /unload_lora_adapter, the "served:adapter" model
parameter and `lora_path` on chat, completions and /generate, every LoRA error, LRU eviction beyond
--max-loaded-loras, the implicit reload of an unloaded adapter, an unload waiting for requests in
flight, and the acceptance scale (an assumption of the twin).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.integration.test_sim_server import _start, get, post, sse, twin
from tests.support import specroute
from twin.engine import Engine
from twin.lora import parse_lora_paths, parse_model_parameter, resolve_lora_path
from twin.options import LoraAdapter
from twin.profile import load_profile

SERVED = "kimi-k2.6"
PINNED = '{"lora_name": "pinned", "lora_path": "/adapters/pinned", "pinned": true}'
ADAPTERS = ("--lora-paths", "sql=/adapters/sql", "/adapters/plain", PINNED)
MSG = [{"role": "user", "content": "Write a SQL query that counts orders per customer."}]
NOT_ENABLED_LOAD = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MSG, "max_tokens": 8, **extra}


def _card(name: str, path: str, created: int) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": path,
        "parent": SERVED,
        "max_model_len": None,
    }


def _ids(url: str) -> list[str]:
    status, body = get(f"{url}/v1/models")
    assert status == 200
    return [c["id"] for c in body["data"]]


def _update(success: bool, error: str | None, loaded: dict[str, str] | None) -> dict[str, Any]:
    return {"rid": None, "http_worker_ipc": None, "success": success, "error_message": error, "loaded_adapters": loaded}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A DFlash twin with three adapters; tests on it never load or unload."""
    yield from _start("k26-dflash", *ADAPTERS)


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    yield from _start("k26-ar")  # no LoRA flag


# ------------------------------------------------------------------------------- flags


def test_lora_paths_formats():
    assert parse_lora_paths([" a=/x/y ", "/p/q", "n=a=b", PINNED]) == [
        LoraAdapter(name="a", path="/x/y"),
        LoraAdapter(name="/p/q", path="/p/q"),
        LoraAdapter(name="n", path="a=b"),  # split on the first '='
        LoraAdapter(name="pinned", path="/adapters/pinned", pinned=True),
    ]


@pytest.mark.parametrize(
    ("profile", "args", "message"),
    [
        (
            "k26-ar",
            ["--enable-lora"],
            "When no initial --lora-paths is provided, you need to specify both --max-lora-rank and "
            "--lora-target-modules for LoRA initialization.",
        ),
        (
            "k26-ar",
            ["--lora-paths", "a=/x", "a=/y"],
            "LoRA with name a already exists. Loaded LoRAs: odict_keys(['a'])",
        ),
        (
            "k26-ar",
            ["--lora-paths", '{"lora_name": "a"}'],
            """'{"lora_name": "a"}' looks like a JSON str, but it does not contain 'lora_name' and 'lora_path' keys.""",
        ),
        (
            "k26-ar",
            ["--lora-paths", "a=/x", "--max-loaded-loras", "2"],
            "max_loaded_loras should be greater than or equal to max_loras_per_batch. "
            "max_loaded_loras=2, max_loras_per_batch=8",
        ),
        (
            "k26-ar",
            ["--lora-paths", "a", "b", "--max-loras-per-batch", "1", "--max-loaded-loras", "1"],
            "The number of LoRA paths should not exceed max_loaded_loras. max_loaded_loras=1, lora_paths=2",
        ),
        (
            "k26-ar",
            ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all", "q_proj"],
            "If 'all' is specified in --lora-target-modules, it should be the only module specified.",
        ),
        ("k26-ar", ["--lora-paths", "a", "--max-loras-per-batch", "0"], "max_loras_per_batch must be positive"),
        (
            "k26-ddtree",
            ["--lora-paths", "a"],
            "LoRA is only compatible with NGRAM, EAGLE, NEXTN, EAGLE3, DFLASH, or DSPARK speculative decoding, "
            "not DDTREE.",
        ),
        ("k26-ar", ["--lora-paths", "a", "--lora-acceptance-scale", "2"], "must be within [0, 1]"),
    ],
)
def test_bad_lora_flags_exit_2_with_sglangs_message(profile, args, message):
    out = subprocess.run(specroute("sim", "--profile", profile, *args), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert message in line and "Traceback" not in out.stderr


def test_enable_lora_with_rank_and_modules_starts_without_adapters():
    with twin("k26-ar", "--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "all") as u:
        assert _ids(u) == [SERVED]
        status, body = post(f"{u}/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"})
        assert (status, body) == (200, _update(True, "", {"a": "/a"}))


# ------------------------------------------------------------------------------ listing


def test_models_lists_adapter_cards_after_the_base_card(url):
    status, body = get(f"{url}/v1/models")
    assert status == 200
    base, *adapters = body["data"]
    assert base["id"] == SERVED and base["parent"] is None and base["max_model_len"]
    assert {a["id"] for a in adapters} == {"sql", "/adapters/plain", "pinned"}
    created = base["created"]
    by_id = {a["id"]: a for a in adapters}
    assert by_id["sql"] == _card("sql", "/adapters/sql", created)
    assert by_id["/adapters/plain"] == _card("/adapters/plain", "/adapters/plain", created)  # name = path
    assert by_id["pinned"] == _card("pinned", "/adapters/pinned", created)


def test_retrieve_model_404s_adapter_names(url):
    assert get(f"{url}/v1/models/{SERVED}")[0] == 200
    for name in ("sql", f"{SERVED}:sql"):
        status, body = get(f"{url}/v1/models/{name}")
        assert status == 404
        assert body["error"] == {
            "message": f"The model '{name}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }


def test_adapter_cards_match_sglangs_model_list_byte_for_byte(url):
    from tests.integration.test_sim_contract import SGLang, _extract, _wheel

    protocol = SGLang(_extract(_wheel())).protocol
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
        raw = r.read()
    listed = protocol.ModelList.model_validate_json(raw)
    assert listed.model_dump_json().encode() == raw
    # the adapter card is what available_models builds, field for field
    sql = next(c for c in listed.data if c.id == "sql")
    built = protocol.ModelCard(id="sql", root="/adapters/sql", parent=SERVED, max_model_len=None, created=sql.created)
    assert built.model_dump_json() == sql.model_dump_json()


def test_listing_follows_the_registrys_lru_order():
    with twin("k26-ar", "--lora-paths", "a=/a", "b=/b", "c=/c") as u:
        assert _ids(u) == [SERVED, "a", "b", "c"]
        assert post(f"{u}/v1/chat/completions", _chat(f"{SERVED}:a"))[0] == 200  # a lookup counts as a use
        assert _ids(u) == [SERVED, "b", "c", "a"]


def test_no_lora_flag_lists_the_base_card_only(plain_url):
    assert _ids(plain_url) == [SERVED]


# ------------------------------------------------------------------------- load / unload


def test_load_and_unload_shapes_and_errors():
    with twin("k26-ar", "--lora-paths", "a=/a") as u:
        status, body = post(f"{u}/load_lora_adapter", {"lora_name": "b", "lora_path": "/b"})
        assert (status, body) == (200, _update(True, "", {"a": "/a", "b": "/b"}))
        assert _ids(u) == [SERVED, "a", "b"]
        status, body = post(f"{u}/load_lora_adapter", {"lora_name": "b", "lora_path": "/other"})
        msg = "Failed to load LoRA adapter b because it is already loaded"
        assert (status, body) == (400, _update(False, msg, {"a": "/a", "b": "/b"}))
        status, body = post(f"{u}/unload_lora_adapter", {"lora_name": "nope"})
        msg = "LoRA with name nope does not exist. Loaded LoRAs: odict_keys(['a', 'b'])"
        assert (status, body) == (400, _update(False, msg, None))
        status, body = post(f"{u}/unload_lora_adapter", {"lora_name": "a"})
        assert (status, body) == (200, _update(True, "", {"b": "/b"}))
        assert _ids(u) == [SERVED, "b"]
        status, body = post(f"{u}/unload_lora_adapter", {})
        assert status == 400 and body["type"] == "Bad Request" and "lora_name" in body["message"]


def test_load_without_content_type_is_read_as_json():
    with twin("k26-ar", "--lora-paths", "a=/a") as u:
        conn = http.client.HTTPConnection(u.removeprefix("http://"), timeout=10)
        conn.request("POST", "/load_lora_adapter", body=b'{"lora_name": "b", "lora_path": "/b"}')
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["success"] is True
        conn.close()


def test_load_and_unload_without_lora_enabled(plain_url):
    for path, body in (
        ("/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),
        ("/unload_lora_adapter", {"lora_name": "a"}),
    ):
        assert post(f"{plain_url}{path}", body) == (400, _update(False, NOT_ENABLED_LOAD, None))


def test_unloaded_adapter_is_reloaded_implicitly_never_loaded_one_is_an_error():
    with twin("k26-ar", "--lora-paths", "a=/a") as u:
        assert post(f"{u}/unload_lora_adapter", {"lora_name": "a"})[0] == 200
        assert _ids(u) == [SERVED]
        status, body = post(f"{u}/v1/chat/completions", _chat(f"{SERVED}:a"))
        assert status == 200 and body["model"] == f"{SERVED}:a"
        assert _ids(u) == [SERVED, "a"]  # reloaded under its name and path
        status, body = post(f"{u}/v1/chat/completions", _chat(f"{SERVED}:zz"))
        assert status == 400
        assert body == {
            "object": "error",
            "message": "Got LoRA adapter that has never been loaded: zz\nAll loaded adapters: dict_keys(['a']).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }


def test_max_loaded_loras_evicts_the_least_recently_used_unpinned_adapter():
    pinned = '{"lora_name": "p", "lora_path": "/p", "pinned": true}'
    args = ("--lora-paths", pinned, "a=/a", "b=/b", "--max-loras-per-batch", "3", "--max-loaded-loras", "3")
    with twin("k26-ar", *args) as u:
        assert post(f"{u}/v1/completions", {"model": f"{SERVED}:a", "prompt": "hi", "max_tokens": 2})[0] == 200
        status, body = post(f"{u}/load_lora_adapter", {"lora_name": "c", "lora_path": "/c"})
        # b is the least recently used unpinned one: a was used, p is pinned
        assert (status, body) == (200, _update(True, "", {"p": "/p", "a": "/a", "c": "/c"}))
        assert _ids(u) == [SERVED, "p", "a", "c"]
        # b was loaded once: a request reloads it, which evicts the LRU unpinned adapter (a)
        assert post(f"{u}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "lora_path": "b"})[0] == 200
        assert _ids(u) == [SERVED, "p", "c", "b"]
        # more unique adapters in one request than may be loaded
        status, body = post(
            f"{u}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "lora_path": ["a", "b", "c", "p"]}
        )
        assert status == 400
        assert body["message"] == "Received request with 4 unique loras requested but max loaded loras is 3"


def test_pinning_every_slot_is_refused():
    args = ("--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all", "--max-loras-per-batch", "2")
    with twin("k26-ar", *args) as u:
        assert post(f"{u}/load_lora_adapter", {"lora_name": "p1", "lora_path": "/p1", "pinned": True})[0] == 200
        status, body = post(f"{u}/load_lora_adapter", {"lora_name": "p2", "lora_path": "/p2", "pinned": True})
        assert status == 400 and body["success"] is False and body["loaded_adapters"] == {"p1": "/p1"}
        assert body["error_message"].startswith("Failed to load LoRA adapter p2 as a pinned adapter.")


def test_unload_waits_for_the_adapters_requests_in_flight():
    # the engine hangs after a few tokens, so the stream cannot finish by itself: only the abort ends it
    with twin("zero", "--lora-paths", "a=/a", "--fault-hang-after-tokens", "3") as u:
        req = urllib.request.Request(
            f"{u}/v1/chat/completions",
            data=json.dumps(_chat(f"{SERVED}:a", max_tokens=1000, stream=True, rid="r1")).encode(),
            headers={"Content-Type": "application/json"},
        )
        stream = urllib.request.urlopen(req, timeout=30)
        assert stream.readline().startswith(b"data: ")  # the request runs with the adapter
        unloaded: list[tuple[int, Any]] = []

        def unload() -> None:
            unloaded.append(post(f"{u}/unload_lora_adapter", {"lora_name": "a"}))

        worker = threading.Thread(target=unload)
        worker.start()
        while "a" in _ids(u):  # unregistered at once: new requests cannot use it
            time.sleep(0.01)
        worker.join(0.3)
        assert worker.is_alive() and not unloaded  # but the unload waits for the request in flight
        abort = urllib.request.Request(
            f"{u}/abort_request", data=b'{"rid": "r1"}', headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(abort, timeout=10) as r:
            assert r.status == 200
        worker.join(10)
        assert unloaded == [(200, _update(True, "", {}))]
        rest = stream.read().decode()
        stream.close()
        assert '"finish_reason":"abort"' in rest and rest.endswith("data: [DONE]\n\n")


# ---------------------------------------------------------------------- requests


def test_model_parameter_selects_the_adapter(url):
    status, body = post(f"{url}/v1/chat/completions", _chat(f"{SERVED}:sql"))
    assert status == 200 and body["model"] == f"{SERVED}:sql"
    assert body["usage"]["completion_tokens"] == 8


def test_model_parameter_takes_precedence_over_lora_path(url):
    assert post(f"{url}/v1/chat/completions", _chat(f"{SERVED}:sql", lora_path="unknown"))[0] == 200
    status, body = post(f"{url}/v1/chat/completions", _chat(f"{SERVED}:unknown", lora_path="sql"))
    assert status == 400 and body["message"].startswith("Got LoRA adapter that has never been loaded: unknown\n")


def test_lora_path_on_every_generation_route(url):
    assert post(f"{url}/v1/chat/completions", _chat("anything", lora_path="sql"))[0] == 200
    status, body = post(f"{url}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3, "lora_path": "sql"})
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    gen = {"text": "hi", "lora_path": "/adapters/plain", "sampling_params": {"max_new_tokens": 3}}
    status, body = post(f"{url}/generate", gen)
    assert status == 200 and len(body["output_ids"]) == 3
    events = sse(f"{url}/v1/chat/completions", _chat(f"{SERVED}:pinned"))
    assert events[-1] == "[DONE]" and events[0]["model"] == f"{SERVED}:pinned"


def test_exact_served_name_and_empty_adapter_mean_the_base_model():
    assert parse_model_parameter("s3://b:v1", "s3://b:v1") == ("s3://b:v1", None)
    assert parse_model_parameter("s3://b:v1:ad", "s3://b:v1") == ("s3://b:v1", "ad")
    assert parse_model_parameter("other:ad", "m") == ("other", "ad")  # the base is not checked
    assert parse_model_parameter("m: ", "m") == ("m", None)
    assert resolve_lora_path("m:", "m", "x") == "x"
    assert resolve_lora_path("m", "m", None) is None


UNKNOWN = (
    "Got LoRA adapter that has never been loaded: nope\n"
    "All loaded adapters: dict_keys(['sql', '/adapters/plain', 'pinned'])."
)


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_adapter_is_a_400_before_any_sse_byte(url, stream):
    for path, body in (
        ("/v1/chat/completions", _chat(f"{SERVED}:nope", stream=stream)),
        ("/v1/completions", {"model": "m", "prompt": "hi", "lora_path": "nope", "stream": stream}),
    ):
        status, err = post(f"{url}{path}", body)
        assert status == 400
        assert err == {"object": "error", "message": UNKNOWN, "type": "BadRequestError", "param": None, "code": 400}


def test_unknown_adapter_on_generate(url):
    status, body = post(f"{url}/generate", {"text": "hi", "lora_path": "nope"})
    assert (status, body) == (400, {"error": {"message": UNKNOWN}})
    events = sse(f"{url}/generate", {"text": "hi", "lora_path": "nope"})
    assert events == [
        {"error": {"message": UNKNOWN, "type": "invalid_request_error", "code": 400, "retryable": False}},
        "[DONE]",
    ]


def test_adapter_requested_without_lora_enabled(plain_url):
    msg = (
        "LoRA adapter 'sql' was requested, but LoRA is not enabled. Please launch the server with "
        "--enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint."
    )
    status, body = post(f"{plain_url}/v1/chat/completions", _chat(f"{SERVED}:sql"))
    assert (status, body["message"], body["type"]) == (400, msg, "BadRequestError")
    assert post(f"{plain_url}/generate", {"text": "hi", "lora_path": "sql"}) == (400, {"error": {"message": msg}})
    assert post(f"{plain_url}/v1/chat/completions", _chat(SERVED))[0] == 200  # no adapter: served as before


def test_openai_sdk_with_an_adapter(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    resp = client.chat.completions.create(model=f"{SERVED}:sql", messages=MSG, max_tokens=5)
    assert resp.model == f"{SERVED}:sql" and resp.usage is not None and resp.usage.completion_tokens == 5
    stream = client.chat.completions.create(model=f"{SERVED}:sql", messages=MSG, max_tokens=5, stream=True)
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in stream)
    cards = {m.id: m for m in client.models.list()}
    assert cards["sql"].model_extra is not None and cards["sql"].model_extra["parent"] == SERVED
    assert cards["sql"].model_extra["root"] == "/adapters/sql" and cards["sql"].owned_by == "sglang"
    with pytest.raises(openai.BadRequestError, match="never been loaded: nope"):
        client.chat.completions.create(model=f"{SERVED}:nope", messages=MSG, max_tokens=5)


# -------------------------------------------------------------------- acceptance (assumption)


def test_acceptance_scale_applies_to_adapter_requests_only():
    with twin("k26-dflash", "--lora-paths", "a=/a", "--lora-acceptance-scale", "0") as u:
        body = {"text": "Solve 3x + 5 = 11 step by step.", "sampling_params": {"max_new_tokens": 64}}
        _, base = post(f"{u}/generate", body)
        _, adapted = post(f"{u}/generate", {**body, "lora_path": "a"})
    assert base["meta_info"]["spec_num_correct_drafts"] > 0
    meta = adapted["meta_info"]
    # every verify pass emits its bonus token only (the first token comes from the prefill)
    assert meta["spec_num_correct_drafts"] == 0 and meta["spec_verify_ct"] == 63
    assert meta["spec_accept_length"] == pytest.approx(64 / 63)


def test_engine_accept_scale_multiplies_the_per_draft_acceptance():
    profile = load_profile("k26-dflash")
    reqs = [Engine(profile, seed=1).submit("r", 100, 10, "Solve 3x + 5 = 11", accept_scale=s) for s in (1.0, 0.5)]
    assert reqs[0].accept_p == Engine(profile, seed=1).submit("r", 100, 10, "Solve 3x + 5 = 11").accept_p
    assert reqs[1].accept_p == pytest.approx(reqs[0].accept_p * 0.5)


def test_prefixes_are_cached_per_adapter():
    """SGLang's radix cache keys a prefix by the adapter too (the adapter's id is appended to the
    request's extra_key): a prompt cached for the base model is no hit under an adapter, nor the
    other way round; under the same adapter it is."""
    prompt = "Summarise the attached ledger line by line. " * 60  # about 660 tokens

    def cached(model: str) -> int:
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
        status, answer = post(f"{url}/v1/completions", body)
        assert status == 200
        return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])

    with twin("k26-dflash", "--enable-cache-report", "--lora-paths", "sql=/adapters/sql") as url:
        assert cached(SERVED) == 0
        assert cached(SERVED) > 0
        assert cached(f"{SERVED}:sql") == 0
        assert cached(f"{SERVED}:sql") > 0
