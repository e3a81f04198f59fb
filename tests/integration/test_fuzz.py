"""Property-based fuzzing of the public routes over HTTP: never a 5xx, every error in OpenAI's shape.

Hypothesis generates request bodies around the OpenAI schema (right and wrong types, missing and
extra fields, SGLang extras, non-JSON bytes) and posts them to `specroute serve`. The number of
cases run is printed (`-s` shows it).
"""

from __future__ import annotations

import json
import os

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CASES = int(os.environ.get("SPECROUTE_FUZZ_CASES", "150"))

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), st.text(max_size=20)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | json_leaf},
    optional={"content": st.text(max_size=60) | json_value},
)
fields = {
    "model": st.sampled_from(["kimi-k2.6", "qwen3.6-27b", "kimi-k2.6@k26-ar", "nope", "kimi-k2.6@nope"]) | json_leaf,
    "messages": st.lists(message, max_size=3) | json_value,
    "prompt": st.text(max_size=60) | st.lists(st.text(max_size=10), max_size=3) | json_value,
    "stream": st.booleans() | json_leaf,
    "max_tokens": st.integers(-5, 12) | json_leaf.filter(lambda v: not isinstance(v, int) or v < 13),
    "temperature": st.floats(-1, 3) | json_leaf,
    "n": st.integers(-1, 3),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | json_leaf}) | json_leaf,
    "return_spec_tokens_details": st.booleans() | json_leaf,
    "top_k": st.integers(-2, 50),
    "ignore_eos": st.booleans(),
    "rid": st.text(max_size=10),
}
body = st.fixed_dictionaries({}, optional=fields).map(lambda d: json.dumps(d).encode())
# Mostly-valid requests, so that the relay paths (streams, spec details, SGLang extras) are fuzzed too.
valid_chat = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["kimi-k2.6", "qwen3.6-27b", "kimi-k2.6@k26-dflash"]),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=80)}), min_size=1, max_size=3
        ),
        "max_tokens": st.integers(0, 12),
    },
    optional={
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "return_spec_tokens_details": st.booleans(),
        "temperature": st.floats(0, 2),
        "top_k": st.integers(1, 50),
        "ignore_eos": st.booleans(),
        "extra_field": json_value,
    },
).map(lambda d: {**d, "prompt": " ".join(m["content"] for m in d["messages"])})
valid = valid_chat.map(
    lambda d: json.dumps({k: v for k, v in d.items() if not (k == "stream_options" and not d.get("stream"))}).encode()
)
raw_bytes = st.binary(max_size=200) | json_value.map(lambda v: json.dumps(v).encode())

counted = {"cases": 0, "by_status": {}}


async def _post(url: str, data: bytes) -> tuple[int, bytes, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s,
        s.post(url, data=data, headers={"Content-Type": "application/json"}) as r,
    ):
        return r.status, await r.read(), r.headers.get("content-type", "")


def _check(status: int, raw: bytes, content_type: str) -> None:
    counted["cases"] += 1
    counted["by_status"][status] = counted["by_status"].get(status, 0) + 1
    assert status < 500, (status, raw[:300])
    if status != 200:
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    elif content_type.startswith("text/event-stream"):
        assert raw.endswith(b"data: [DONE]\n\n")
    else:
        assert "choices" in json.loads(raw)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_fuzz_openai_routes(gateway_url, route):
    import asyncio

    @settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(data=valid | body | raw_bytes)
    def one(data: bytes) -> None:
        _check(*asyncio.run(_post(gateway_url + route, data)))

    one()
    print(f"\nfuzz {route}: {counted['cases']} cases so far, statuses {counted['by_status']}")
