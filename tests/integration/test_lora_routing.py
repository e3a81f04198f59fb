"""LoRA adapters through the gateway, with the real `openai` SDK and twins that serve SGLang's
multi-LoRA API: a request naming an adapter goes only to a backend that has it loaded, adapters
loaded and unloaded at runtime are followed, and one loaded nowhere is a 404 naming it."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.support import gateway, get_json, wait_until

MSG = [{"role": "user", "content": "Rewrite this clause in plain English: the party of the first part..."}]
FAST_POLLS = "[health]\ninterval_s = 0.1\nmodels_refresh_s = 0.2\n"


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _adapter_order(twin: str) -> list[str]:
    """The twin's adapter cards, in SGLang's LRU order: a request's adapter moves last."""
    return [c["id"] for c in get_json(f"{twin}/v1/models")["data"] if c["parent"]]


def test_adapter_requests_go_only_where_the_adapter_is_loaded(tmp_path, twin_factory):
    styled = twin_factory("k26-dflash", "--lora-paths", "style=/adapters/style", "legal=/adapters/legal")
    plain = twin_factory("k26-eagle3")  # no LoRA: a request for an adapter must never land here
    backends = [
        {"name": "styled", "url": styled, "model": "kimi-k2.6", "strategy": "dflash"},
        {"name": "plain", "url": plain, "model": "kimi-k2.6", "strategy": "eagle3"},
    ]
    with gateway(tmp_path, backends, FAST_POLLS) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)

        def ids() -> list[str]:
            return [m.id for m in client.models.list().data]

        assert wait_until(lambda: "kimi-k2.6:style" in ids())
        assert ids() == ["kimi-k2.6", "kimi-k2.6:legal", "kimi-k2.6:style"]
        card = client.models.retrieve("kimi-k2.6:style")
        assert card.model_extra["parent"] == "kimi-k2.6" and card.model_extra["backends"] == ["styled"]
        assert _adapter_order(styled) == ["style", "legal"]

        served = set()
        for _ in range(4):
            raw = client.chat.completions.with_raw_response.create(model="kimi-k2.6:style", messages=MSG, max_tokens=4)
            served.add(raw.headers["x-specroute-backend"])
            assert raw.parse().usage.completion_tokens == 4
        assert served == {"styled"}
        assert _adapter_order(styled) == ["legal", "style"]  # the twin was asked for `style`

        stream = client.chat.completions.create(
            model="kimi-k2.6", messages=MSG, max_tokens=4, stream=True, extra_body={"lora_path": "legal"}
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert _adapter_order(styled) == ["style", "legal"]  # and then for `legal`, by lora_path

        # base-model requests still use the whole pool
        bases = {
            client.chat.completions.with_raw_response.create(
                model="kimi-k2.6", messages=MSG, max_tokens=2, extra_headers={"x-specroute-backend": name}
            ).headers["x-specroute-backend"]
            for name in ("styled", "plain")
        }
        assert bases == {"styled", "plain"}

        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="kimi-k2.6:nope", messages=MSG, max_tokens=2)
        assert e.value.body["code"] == "model_not_found" and "'nope'" in e.value.body["message"]
        assert "['legal', 'style']" in e.value.body["message"]
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(
                model="kimi-k2.6", messages=MSG, max_tokens=2, extra_body={"lora_path": "nope"}
            )
        assert e.value.body["param"] == "lora_path"
        with pytest.raises(openai.NotFoundError):  # pinned to a backend without it
            client.chat.completions.create(model="kimi-k2.6:style@plain", messages=MSG, max_tokens=2)

        # loaded at runtime: routed to once the poller has re-read the cards; unloaded: gone
        loaded = _post(f"{styled}/load_lora_adapter", {"lora_name": "fresh", "lora_path": "/adapters/fresh"})
        assert loaded["success"]
        assert wait_until(lambda: "kimi-k2.6:fresh" in ids())
        raw = client.chat.completions.with_raw_response.create(model="kimi-k2.6:fresh", messages=MSG, max_tokens=2)
        assert raw.headers["x-specroute-backend"] == "styled"
        assert _post(f"{styled}/unload_lora_adapter", {"lora_name": "fresh"})["success"]
        assert wait_until(lambda: "kimi-k2.6:fresh" not in ids())
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="kimi-k2.6:fresh", messages=MSG, max_tokens=2)
