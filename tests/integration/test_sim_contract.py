"""The twin against SGLang 0.5.23's own pydantic models and chunk serializer.

The `sglang==0.5.23` wheel is downloaded once (`pip download --no-deps`) into
~/.cache/specroute/wheels; only `entrypoints/openai/protocol.py` and `sse_utils.py` are loaded from
it, under empty package modules so that `sglang/__init__.py` (which pulls torch and the runtime)
never runs. The one function protocol.py takes from `sglang/utils.py` (`convert_json_schema_to_str`,
pure) is compiled from the wheel's own source: nothing is stubbed with fake code. pydantic,
openai and msgspec come from the venv; FastAPI (dev extra) builds the validation-error text.

Every response of the scenarios below is checked three ways:
- it validates against SGLang's response model (`ChatCompletionResponse`,
  `ChatCompletionStreamResponse`, `CompletionStreamResponse`, `ErrorResponse`, ...);
- chat chunks on SGLang's msgspec path are rebuilt with `sse_utils.build_sse_content` from their
  own fields and must match byte for byte;
- everything SGLang writes with pydantic is re-dumped by the model (`model_dump_json()`, with
  `exclude_none` for the completions usage chunk) and must match byte for byte.
Skipped, with the reason printed, only when the wheel is not cached and PyPI is unreachable.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_sim_server import _start, twin

CACHE = Path.home() / ".cache" / "specroute"
WHEELS = CACHE / "wheels"
VERSION = "0.5.23"
_FILES = ("sglang/srt/entrypoints/openai/protocol.py", "sglang/srt/entrypoints/openai/sse_utils.py", "sglang/utils.py")


def _wheel() -> Path:
    found = sorted(WHEELS.glob(f"sglang-{VERSION}-*.whl"))
    if found:
        return found[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"sglang=={VERSION}", "-d", str(WHEELS)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = sorted(WHEELS.glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        reason = f"sglang=={VERSION} wheel not cached and pip download failed: {out.stderr.strip()[-300:]}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    return found[0]


def _extract(wheel: Path) -> Path:
    root = CACHE / f"sglang-{VERSION}-contract"
    if not all((root / f).is_file() for f in _FILES):
        with zipfile.ZipFile(wheel) as z:
            for f in _FILES:
                z.extract(f, root)
    return root / "sglang"


class SGLang:
    """SGLang's protocol and sse_utils modules, loaded from the wheel."""

    def __init__(self, root: Path) -> None:
        for name, sub in (
            ("sglang", ""),
            ("sglang.srt", "srt"),
            ("sglang.srt.entrypoints", "srt/entrypoints"),
            ("sglang.srt.entrypoints.openai", "srt/entrypoints/openai"),
        ):
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root / sub)]
            sys.modules.setdefault(name, pkg)
        utils = types.ModuleType("sglang.utils")
        src = (root / "utils.py").read_text()
        fn = next(
            n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "convert_json_schema_to_str"
        )
        prelude = ast.parse("import json\nfrom typing import Type, Union\nfrom pydantic import BaseModel\n").body
        exec(compile(ast.Module(body=[*prelude, fn], type_ignores=[]), str(root / "utils.py"), "exec"), utils.__dict__)
        sys.modules["sglang.utils"] = utils
        self.protocol = self._load(
            "sglang.srt.entrypoints.openai.protocol", root / "srt/entrypoints/openai/protocol.py"
        )
        self.sse = self._load("sglang.srt.entrypoints.openai.sse_utils", root / "srt/entrypoints/openai/sse_utils.py")

    @staticmethod
    def _load(name: str, path: Path) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod


@pytest.fixture(scope="module")
def sgl() -> SGLang:
    return SGLang(_extract(_wheel()))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _start(
        "k26-dflash", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-cache-report"
    )


@pytest.fixture(scope="module")
def ar_url() -> Iterator[str]:
    yield from _start("k26-ar")


def _raw(url: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
    """POST `body` (GET when it is None); the status and the raw body."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _frames(raw: bytes) -> list[bytes]:
    out = [f for f in raw.split(b"\n\n") if f]
    assert all(f.startswith(b"data: ") for f in out)
    assert out[-1] == b"data: [DONE]"
    return [f[len(b"data: ") :] for f in out[:-1]]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MSG = [{"role": "user", "content": "Tell me about the history of Lyon."}]

CHAT_STREAMS = {
    "thinking": {
        "messages": MSG,
        "max_tokens": 1500,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
    },
    "thinking_continuous_usage": {
        "messages": MSG,
        "max_tokens": 900,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "thinking_off": {"messages": MSG, "max_tokens": 40, "chat_template_kwargs": {"thinking": False, "other": 1}},
    "inline_reasoning": {"messages": MSG, "max_tokens": 1200, "separate_reasoning": False},
    "tool_call": {
        "messages": [{"role": "user", "content": "Weather in Paris please?"}],
        "tools": [WEATHER],
        "max_tokens": 4000,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "tools_no_call": {
        "messages": [{"role": "user", "content": "Write a poem."}],
        "tools": [WEATHER],
        "max_tokens": 30,
        "chat_template_kwargs": {"thinking": False},
    },
}


def _check_chat_chunk(sgl: SGLang, raw: bytes) -> None:
    obj = json.loads(raw)
    p = sgl.protocol
    model = p.ChatCompletionStreamResponse.model_validate(obj)  # every chunk is a valid chunk
    choices = obj["choices"]
    pydantic_path = (
        not choices
        or "tool_calls" in choices[0]["delta"]
        or ("role" in choices[0]["delta"] and choices[0]["delta"]["role"] is None)
    )
    if pydantic_path:
        assert model.model_dump_json().encode() == raw
        return
    (c,) = choices
    d = c["delta"]
    rebuilt = sgl.sse.build_sse_content(
        chunk_id=obj["id"],
        created=obj["created"],
        model=obj["model"],
        index=c["index"],
        role=d.get("role"),
        content=d.get("content"),
        reasoning_content=d["reasoning_content"],
        finish_reason=c["finish_reason"],
        logprobs=c["logprobs"],
        matched_stop=c["matched_stop"],
        usage=obj.get("usage"),
    )
    assert rebuilt.encode() == b"data: " + raw + b"\n\n"
    if "usage" in obj:  # continuous usage: a real UsageInfo dump
        assert p.UsageInfo.model_validate(obj["usage"]).model_dump() == obj["usage"]


@pytest.mark.parametrize("name", list(CHAT_STREAMS))
def test_chat_stream_chunks_match_sglang(sgl, url, name):
    body = {"model": "kimi-k2.6", **CHAT_STREAMS[name], "stream": True}
    sgl.protocol.ChatCompletionRequest.model_validate(body)  # the request is SGLang-valid
    status, raw = _raw(url, "/v1/chat/completions", body)
    assert status == 200
    frames = _frames(raw)
    for frame in frames:
        _check_chat_chunk(sgl, frame)
    kinds = {k for f in frames for c in json.loads(f)["choices"] for k, v in c["delta"].items() if v and k != "role"}
    expected = {
        "thinking": {"reasoning_content", "content"},
        "thinking_continuous_usage": {"reasoning_content", "content"},
        "thinking_off": {"content"},
        "inline_reasoning": {"content"},
        "tool_call": {"reasoning_content", "tool_calls"},
        "tools_no_call": {"content"},
    }[name]
    assert kinds == expected


@pytest.mark.parametrize("name", ["thinking", "tool_call", "thinking_off"])
def test_chat_parallel_samples_streamed_match_sglang(sgl, url, name):
    body = {"model": "kimi-k2.6", **CHAT_STREAMS[name], "stream": True, "n": 2}
    body["stream_options"] = {"include_usage": True}
    sgl.protocol.ChatCompletionRequest.model_validate(body)
    status, raw = _raw(url, "/v1/chat/completions", body)
    assert status == 200
    frames = _frames(raw)
    for frame in frames:
        _check_chat_chunk(sgl, frame)
    objs = [json.loads(f) for f in frames]
    roles = [c["index"] for o in objs for c in o["choices"] if c["delta"].get("role") == "assistant"]
    finishes = [(c["index"], o["id"]) for o in objs for c in o["choices"] if c["finish_reason"]]
    assert sorted(roles) == [0, 1] and sorted(i for i, _ in finishes) == [0, 1]
    # the finish chunks come after every sample's last token, under one id (the last chunk's)
    assert len({rid for _, rid in finishes}) == 1 and all(not o["choices"] for o in objs[len(objs) - 1 :])
    usage = objs[-1]["usage"]
    parts = [o for o in objs if o["choices"] and not o["choices"][0]["finish_reason"]]
    assert usage["completion_tokens"] > 0 and len({o["id"] for o in parts}) == 2  # each sample under its own id


def test_chat_parallel_samples_match_sglang(sgl, url):
    body = {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 300, "n": 3, "return_spec_tokens_details": True}
    sgl.protocol.ChatCompletionRequest.model_validate(body)
    status, raw = _raw(url, "/v1/chat/completions", body)
    assert status == 200
    m = sgl.protocol.ChatCompletionResponse.model_validate_json(raw)
    assert m.model_dump_json().encode() == raw
    assert [c.index for c in m.choices] == [0, 1, 2] and len(m.sglext.spec_tokens_details) == 3
    assert m.usage.completion_tokens == 3 * 300  # summed over the samples
    assert all(c.message.reasoning_content for c in m.choices) and 0 < m.usage.reasoning_tokens < 900


@pytest.mark.parametrize(
    "body",
    [
        {"messages": MSG, "max_tokens": 1500, "return_spec_tokens_details": True},
        {"messages": MSG, "max_tokens": 20, "return_meta_info": True, "chat_template_kwargs": {"thinking": False}},
        {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER], "max_tokens": 4000},
    ],
    ids=["thinking_sglext", "meta_info", "tool_call"],
)
def test_chat_non_stream_matches_sglang(sgl, url, body):
    body = {"model": "kimi-k2.6", **body}
    sgl.protocol.ChatCompletionRequest.model_validate(body)
    status, raw = _raw(url, "/v1/chat/completions", body)
    assert status == 200
    model = sgl.protocol.ChatCompletionResponse.model_validate_json(raw)
    assert model.model_dump_json().encode() == raw


@pytest.mark.parametrize(
    "stream_options", [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}]
)
def test_completion_stream_matches_sglang(sgl, url, stream_options):
    body: dict[str, Any] = {
        "model": "kimi-k2.6",
        "prompt": "def fib(n):",
        "max_tokens": 30,
        "stream": True,
        "return_spec_tokens_details": True,
    }
    if stream_options:
        body["stream_options"] = stream_options
    sgl.protocol.CompletionRequest.model_validate(body)
    status, raw = _raw(url, "/v1/completions", body)
    assert status == 200
    frames = _frames(raw)
    model = sgl.protocol.CompletionStreamResponse
    for frame in frames:
        m = model.model_validate_json(frame)
        is_final_usage = not m.choices and m.usage is not None
        assert m.model_dump_json(exclude_none=is_final_usage).encode() == frame
    finishes = [json.loads(f)["choices"][0]["finish_reason"] for f in frames if json.loads(f)["choices"]]
    assert finishes[-1] == "length" and all(x is None for x in finishes[:-1])


def test_model_list_and_card_match_sglang(sgl, url):
    status, raw = _raw(url, "/v1/models", None)
    assert status == 200
    listed = sgl.protocol.ModelList.model_validate_json(raw)
    assert listed.model_dump_json().encode() == raw
    (card,) = listed.data
    assert card.root == card.id == "kimi-k2.6" and card.max_model_len
    status, raw = _raw(url, "/v1/models/kimi-k2.6", None)
    assert status == 200 and sgl.protocol.ModelCard.model_validate_json(raw).model_dump_json().encode() == raw
    status, raw = _raw(url, "/v1/models/other/model", None)
    error = json.loads(raw)["error"]
    assert status == 404 and error["code"] == "model_not_found" and "'other/model'" in error["message"]


def test_completion_non_stream_matches_sglang(sgl, ar_url):
    status, raw = _raw(ar_url, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 5})
    assert status == 200
    m = sgl.protocol.CompletionResponse.model_validate_json(raw)
    assert m.model_dump_json().encode() == raw


def test_parallel_samples_match_sglang(sgl, url):
    body = {"model": "m", "prompt": "Solve 3x + 4 = 19, then check it. " * 40, "max_tokens": 24, "n": 3, "rid": "r"}
    status, raw = _raw(url, "/v1/completions", {**body, "return_spec_tokens_details": True})
    assert status == 200
    m = sgl.protocol.CompletionResponse.model_validate_json(raw)
    assert m.model_dump_json().encode() == raw
    # every sample gets a fresh rid (tokenizer_manager: `regenerate_rid`), the client's is not kept
    assert [c.index for c in m.choices] == [0, 1, 2] and m.id != "r" and len(m.id) == 32
    details = m.sglext.spec_tokens_details
    assert isinstance(details, list) and len(details) == 3  # one entry per sequence
    assert m.usage.completion_tokens == 3 * 24 and 200 < m.usage.prompt_tokens < 1000  # the prompt counted once
    # prefilled once alone first, as SGLang does: the samples find it cached (all but a partial block)
    assert m.usage.prompt_tokens_details.cached_tokens >= m.usage.prompt_tokens - 64
    # each entry is that sequence's own: 24 tokens over its verify passes
    assert all(d.spec_accept_length == pytest.approx(24 / d.spec_verify_ct) for d in details)


@pytest.mark.parametrize("stream_options", [{"include_usage": True}, {"continuous_usage_stats": True}])
def test_parallel_samples_streamed_match_sglang(sgl, url, stream_options):
    body = {
        "model": "m",
        "prompt": "Solve 3x + 4 = 19, then check it. " * 40,
        "max_tokens": 20,
        "n": 3,
        "stream": True,
        "stream_options": stream_options,
        "return_spec_tokens_details": True,
    }
    status, raw = _raw(url, "/v1/completions", body)
    assert status == 200
    frames = _frames(raw)
    model = sgl.protocol.CompletionStreamResponse
    ids: dict[int, set[str]] = {}
    finishes: dict[int, list[str | None]] = {}
    for frame in frames:
        m = model.model_validate_json(frame)
        is_final_usage = not m.choices and m.usage is not None
        assert m.model_dump_json(exclude_none=is_final_usage).encode() == frame
        for c in m.choices:
            ids.setdefault(c.index, set()).add(m.id)
            finishes.setdefault(c.index, []).append(c.finish_reason)
    # each sample's chunks under its own rid, ending once with its finish reason
    assert sorted(ids) == [0, 1, 2] and all(len(v) == 1 for v in ids.values()) and len(set().union(*ids.values())) == 3
    assert all(f[-1] == "length" and all(x is None for x in f[:-1]) for f in finishes.values())
    (tail,) = [
        model.model_validate_json(f) for f in frames if not json.loads(f)["choices"] and "sglext" in json.loads(f)
    ]
    assert len(tail.sglext.spec_tokens_details) == 3
    usage = [
        model.model_validate_json(f).usage
        for f in frames
        if not json.loads(f)["choices"] and json.loads(f).get("usage")
    ]
    if stream_options.get("include_usage"):
        assert usage[-1].completion_tokens == 3 * 20


def _fastapi_message(errors: list[dict[str, Any]]) -> str:
    from fastapi.exceptions import RequestValidationError

    exc = RequestValidationError(errors)
    return f"{exc} {exc.errors()}"


@pytest.mark.parametrize(
    "tools,tool_choice",
    [
        ([{"type": "function", "function": {"description": "no name"}}], None),
        ([{"type": "function"}], None),
        ({"not": "a list"}, None),
        ([{"function": {"name": 3, "strict": "maybe"}}], None),
        ([WEATHER], "sometimes"),
        ([WEATHER], {"type": "function", "function": {"name": 7}}),
    ],
)
def test_invalid_tools_rejected_with_sglangs_validation_text(sgl, url, tools, tool_choice):
    from pydantic import ValidationError

    body: dict[str, Any] = {"model": "kimi-k2.6", "messages": MSG, "tools": tools}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    with pytest.raises(ValidationError) as info:
        sgl.protocol.ChatCompletionRequest.model_validate(body)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors(include_url=False)]
    status, raw = _raw(url, "/v1/chat/completions", body)
    assert status == 400
    err = sgl.protocol.ErrorResponse.model_validate_json(raw)
    assert err.type == "Bad Request" and err.param is None and err.code == 400
    endpoint = (
        '\n  File "sglang/srt/entrypoints/http_server.py", line 1870, in '
        "openai_v1_chat_completions\n    POST /v1/chat/completions"
    )
    # SGLang's text names its install path on the endpoint line; everything else is identical
    assert err.message.replace(endpoint, "") == _fastapi_message(errors)


def test_queue_full_stream_error_event_matches_sglang(sgl):
    # a queue of 0 rejects every request, as SGLang's `len(queue) + 1 <= max_queued` does
    with twin("k26-ar", "--max-queued-requests", "0") as u:
        status, raw = _raw(u, "/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": 3, "stream": True})
    assert status == 200
    (frame,) = _frames(raw)
    obj = json.loads(frame)
    err = sgl.protocol.ErrorResponse.model_validate(obj["error"])
    # create_streaming_error_response: json.dumps of {"error": ErrorResponse.model_dump()}
    assert frame == json.dumps({"error": err.model_dump()}).encode()
    assert err.code == 503 and err.type == "SERVICE_UNAVAILABLE"


def test_the_byte_comparison_is_not_vacuous(sgl):
    """A chunk SGLang would write differently (null usage kept, keys reordered) is caught."""
    good = (
        b'{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index"'
        b':0,"delta":{"reasoning_content":null,"content":"x"},"logprobs":null,"finish_reason":'
        b'null,"matched_stop":null}]}'
    )
    _check_chat_chunk(sgl, good)
    for bad in (
        good[:-1] + b',"usage":null}',
        good.replace(b'"reasoning_content":null,"content":"x"', b'"content":"x","reasoning_content":null'),
    ):
        with pytest.raises(AssertionError):
            _check_chat_chunk(sgl, bad)
