"""The gateway against an older SGLang 0.5.x (the twin's --compat mode): no spec details, /get_load."""

import openai

from tests.support import gateway, get_json, wait_until


def test_older_sglang_falls_back_to_get_load_and_still_serves(tmp_path, twin_factory):
    old = twin_factory("k26-dflash", "--compat", "0.5.9")
    new = twin_factory("k26-dflash")
    backends = [
        {"name": "old", "url": old, "model": "kimi-k2.6", "strategy": "dflash"},
        {"name": "new", "url": new, "model": "kimi-k2.6", "strategy": "dflash"},
    ]
    with gateway(tmp_path, backends, "[health]\ninterval_s = 0.1\n") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        done = client.chat.completions.create(
            model="kimi-k2.6@old",
            max_tokens=16,
            messages=[{"role": "user", "content": "What is 2+2?"}],
            extra_body={"return_spec_tokens_details": True},
        )
        assert done.usage.completion_tokens == 16
        assert "sglext" not in (done.model_extra or {})  # the old server has none to give

        def state():
            return {b["name"]: b for b in get_json(f"{url}/admin/backends")["backends"]}

        assert wait_until(
            lambda: state()["old"]["reported_load"] is not None and state()["new"]["reported_load"] is not None
        )
        s = state()
    assert s["old"]["load_source"] == "/get_load" and s["old"]["reported_load"]["source"] == "get_load"
    assert s["new"]["load_source"].startswith("/v1/loads") and s["new"]["reported_load"]["running"] == 0
    assert s["new"]["server_info"]["speculative_algorithm"] == "DFLASH"
    assert s["new"]["cap"] == 48  # from /server_info max_running_requests
