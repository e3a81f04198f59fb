"""The twin ends an answer where the model would (EOS), unless the client asks it to ignore EOS:
every route, over real HTTP (twin.answers)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.integration.test_sim_server import _start, post, sse
from twin.answers import answer_tokens
from twin.chat_output import EOS_TOKEN_ID
from twin.domain import classify, prompt_key
from twin.profile import load_profile
from twin.protocol import CHAT_DEFAULT_MAX_TOKENS
from twin.text import render_chat
from twin.thinking import reasoning_tokens

PROFILE = load_profile("k26-dflash")
LYON = "Tell me about the history of Lyon."
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _start("k26-dflash", "--reasoning-parser", "kimi_k2", "--enable-response-store")


def _answer_of(text: str) -> int:
    length = answer_tokens(PROFILE.answer, classify(text), prompt_key(text))
    assert length is not None
    return length


def _chat(content: str, **extra: object) -> dict:
    return {"model": "kimi-k2.6", "messages": [{"role": "user", "content": content}], **NO_THINKING, **extra}


def test_answer_lengths_are_per_prompt_and_spread_around_each_domains_median():
    answer = PROFILE.answer
    assert answer is not None
    for domain in ("math", "code", "chat"):
        lengths = sorted(answer_tokens(answer, domain, key) or 0 for key in range(4001))
        assert lengths[2000] == pytest.approx(getattr(answer, domain), rel=0.05)
        assert lengths[0] < lengths[2000] < lengths[-1]
    assert answer_tokens(answer, "chat", 7) == answer_tokens(answer, "chat", 7)
    assert answer_tokens(None, "chat", 7) is None  # a profile without answer lengths: no EOS


def test_a_chat_answer_without_max_tokens_ends_at_eos_not_at_a_default_budget(url):
    expected = _answer_of(render_chat([("user", LYON)]))
    assert expected > CHAT_DEFAULT_MAX_TOKENS  # the budget a twin without EOS gave such a request
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    done = client.chat.completions.create(
        model="kimi-k2.6", messages=[{"role": "user", "content": LYON}], extra_body=NO_THINKING
    )
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].model_extra["matched_stop"] == EOS_TOKEN_ID
    assert done.usage.completion_tokens == expected
    # the same prompt, the same length; streamed too
    chunks = [c for c in sse(f"{url}/v1/chat/completions", _chat(LYON, stream_options={"include_usage": True}))]
    finishes = [ch["finish_reason"] for c in chunks if isinstance(c, dict) for ch in c.get("choices", [])]
    assert [f for f in finishes if f] == ["stop"]
    assert chunks[-2]["usage"]["completion_tokens"] == expected


def test_max_tokens_below_the_answer_cuts_it_and_ignore_eos_runs_to_the_budget(url):
    expected = _answer_of(render_chat([("user", LYON)]))
    status, short = post(f"{url}/v1/chat/completions", _chat(LYON, max_tokens=expected - 20))
    assert status == 200 and short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == expected - 20
    status, long = post(f"{url}/v1/chat/completions", _chat(LYON, max_tokens=expected + 30, ignore_eos=True))
    assert status == 200 and long["choices"][0]["finish_reason"] == "length"
    assert long["usage"]["completion_tokens"] == expected + 30


def test_a_thinking_answer_ends_after_its_reasoning_and_its_answer(url):
    text = render_chat([("user", LYON)])
    reasoning = reasoning_tokens(PROFILE.reasoning, classify(text), prompt_key(text))
    body = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": LYON}]}
    status, done = post(f"{url}/v1/chat/completions", body)
    assert status == 200 and done["choices"][0]["finish_reason"] == "stop"
    assert done["usage"]["reasoning_tokens"] == reasoning
    assert done["usage"]["completion_tokens"] == reasoning + _answer_of(text)


def test_completions_and_generate_end_at_eos_unless_told_to_ignore_it(url):
    prompt = "Once upon a time"
    expected = _answer_of(prompt)
    body = {"model": "kimi-k2.6", "prompt": prompt, "max_tokens": expected + 40}
    status, done = post(f"{url}/v1/completions", body)
    assert status == 200 and done["choices"][0]["finish_reason"] == "stop"
    assert done["choices"][0]["matched_stop"] == EOS_TOKEN_ID
    assert done["usage"]["completion_tokens"] == expected
    status, done = post(f"{url}/v1/completions", {**body, "ignore_eos": True})
    assert done["choices"][0]["finish_reason"] == "length" and done["usage"]["completion_tokens"] == expected + 40
    params = {"max_new_tokens": expected + 40}
    status, native = post(f"{url}/generate", {"text": prompt, "sampling_params": params})
    assert status == 200 and native["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_TOKEN_ID}
    assert native["meta_info"]["completion_tokens"] == expected
    status, native = post(f"{url}/generate", {"text": prompt, "sampling_params": {**params, "ignore_eos": True}})
    assert native["meta_info"]["finish_reason"]["type"] == "length"
    assert native["meta_info"]["completion_tokens"] == expected + 40


def test_a_response_without_max_output_tokens_completes_at_eos(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    done = client.responses.create(model="kimi-k2.6", input=LYON, reasoning={"effort": "none"})
    assert done.status == "completed"
    assert done.usage.output_tokens == _answer_of(render_chat([("user", LYON)]))
    capped = client.responses.create(model="kimi-k2.6", input=LYON, reasoning={"effort": "none"}, max_output_tokens=42)
    assert capped.status == "incomplete" and capped.usage.output_tokens == 40  # 2 of headroom (to_sampling_params)
