"""What the public evidence says the twin must show, checked over HTTP against running twins.

Each test drives real twin processes (`specroute sim`, scaled time) and reads what SGLang itself
reports: per-request `spec_accept_length` (`meta_info`, `sglext`), `/server_info`, and the decode
moments of `/v1/loads` (steps, batch x step time, tokens decoded), from which the per-request
decode speed follows without a wall-clock measurement: tokens / sum(batch x step time). The
bounds and their sources are in docs/twin.md ("What the evidence says the twin must show").
"""

from __future__ import annotations

import asyncio
import subprocess

import aiohttp
import pytest

from tests.conftest import TEST_TIME_SCALE
from tests.support import get_json, specroute, wait_until

SCALE = float(TEST_TIME_SCALE)
MATH = (
    "A store sells pencils at 3 for $1. How much do {n} pencils cost? Calculate the answer.",
    "Solve the equation {n}x + 7 = 22 and explain each step of the solution.",
    "What is the sum of the first {n} positive integers? Show how to compute it.",
    "Natalia sold clips to {n} of her friends in April, and then half as many in May. How many altogether?",
)
CODE = (
    "Write a Python function that returns the longest palindromic substring of a string (variant {n}).",
    "Implement a binary search tree in Python with insert, delete and search methods (variant {n}).",
    "Write a SQL query that returns the top {n} customers by total order value.",
    "Write a Python function that merges {n} sorted lists into one sorted list.",
)
CHAT = (
    "Tell me about the history of the city of Lyon, part {n}, and what a visitor should see there.",
    "What are some good ways to stay motivated when learning a new language? Give me {n} ideas.",
    "Write a short story about a lighthouse keeper who finds message number {n} in a bottle.",
    "Describe an ideal weekend in the mountains for a group of {n} friends.",
)
PROMPTS = {"math": MATH, "code": CODE, "chat": CHAT}


def _prompts(domain: str, count: int, salt: str = "") -> list[str]:
    """`count` distinct prompts of a domain: distinct so that no NGRAM server answers one twice."""
    group = PROMPTS[domain]
    return [group[i % len(group)].format(n=i + 3) + salt for i in range(count)]


async def _generate(session: aiohttp.ClientSession, url: str, text: str, **params: object) -> dict:
    body = {"text": text, "sampling_params": {"ignore_eos": True, **params}}
    async with session.post(f"{url}/generate", json=body) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def _closed_loop(url: str, prompts: list[str], concurrency: int, **params: object) -> list[dict]:
    """Every prompt through /generate, `concurrency` in flight at a time: their meta_info."""
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:

        async def one(text: str) -> dict:
            async with sem:
                out = await _generate(session, url, text, **params)
                return dict(out["meta_info"])

        return list(await asyncio.gather(*(one(t) for t in prompts)))


def _moments(url: str) -> list[float]:
    loads = get_json(f"{url}/v1/loads")["loads"][0]
    return list(loads.get("decode_moments") or [0.0] * 6)


def run(url: str, prompts: list[str], concurrency: int, **params: object) -> tuple[float, float]:
    """(mean spec_accept_length, per-request decode tok/s in simulated time) of one closed loop.

    The decode speed is tokens decoded over the sum of batch x step time of the decode moments
    (`/v1/loads`; SGLang's `decode_moments`: steps, sum batch, sum step us, sum batch^2, sum
    batch x step us, sum tokens), scaled back from the twin's wall clock."""
    before = _moments(url)
    metas = asyncio.run(_closed_loop(url, prompts, concurrency, **params))
    after = _moments(url)
    batch_us = (after[4] - before[4]) / SCALE
    tokens = after[5] - before[5]
    lengths = [m.get("spec_accept_length", 1.0) for m in metas]
    return sum(lengths) / len(lengths), tokens / (batch_us / 1e6)


@pytest.fixture(scope="module")
def k26(twin_factory):
    """One twin per K2.6 strategy, started once for the module."""
    names = ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "k26-ngram")
    return {name: twin_factory(name) for name in names}


# ------------------------------------------------------------------------------ the tree


def test_ddtree_is_no_faster_than_its_dflash_chain_at_batch_and_slower_when_sampling(k26):
    """rmagur1203/vllm-ddtree (independent): DDTree against the same drafter's chain 0.98 / 0.97 /
    0.96x at batch 2 / 4 / 16, 0.78x at batch 1 on a 27B target and 0.69x at T=1; branching adds
    at most +4% tokens per step."""
    prompts = _prompts("math", 16)
    ratio: dict[tuple[int, float], float] = {}
    for batch, bound in ((2, 0.98), (4, 0.97), (16, 0.96)):
        for temperature in (0.0, 1.0):
            params = {"max_new_tokens": 256, "temperature": temperature}
            tree_len, tree = run(k26["k26-ddtree"], prompts, batch, **params)
            chain_len, chain = run(k26["k26-dflash"], prompts, batch, **params)
            ratio[batch, temperature] = tree / chain
            if temperature == 0.0:
                assert tree / chain <= bound, (batch, tree, chain)
                assert tree_len <= 1.05 * chain_len, (batch, tree_len, chain_len)
        # sampling takes the independent study's 11.5% (0.69 / 0.78) off the tree's ratio; the
        # twin's finite runs land within a few points of it
        assert ratio[batch, 1.0] < 1.0
        assert ratio[batch, 1.0] <= 0.92 * ratio[batch, 0.0], ratio


# -------------------------------------------------------------------------- context length


def _long_prompt(tokens: int, i: int) -> str:
    """A chat prompt of about `tokens` tokens (the twin counts 4 characters a token)."""
    para = f"Document {i}: the committee reviewed the river crossing, the schedule and the budget. "
    body = para * (tokens * 4 // len(para) + 1)
    return body[: tokens * 4 - 60] + " Summarize the document above."


def test_acceptance_falls_with_context_for_eagle3_and_much_less_for_windowed_dflash(k26):
    """vllm-project/speculators#684 (independent): an EAGLE-3 head attending to the whole context
    falls from 2.30 to 1.09 tokens per step between 2K and 16K; a windowed drafter holds 0.97 of
    its 4K figure at 20K. K2.6's head was trained at 4K and SGLang does not window it."""
    accept: dict[tuple[str, int], float] = {}
    speed: dict[tuple[str, int], float] = {}
    for name in ("k26-eagle3", "k26-dflash"):
        for ctx in (2048, 16384, 65536):
            prompts = [_long_prompt(ctx, i) for i in range(6)]
            accept[name, ctx], speed[name, ctx] = run(k26[name], prompts, 1, max_new_tokens=384, temperature=0.0)
    eagle_16k = accept["k26-eagle3", 16384] / accept["k26-eagle3", 2048]
    eagle_64k = accept["k26-eagle3", 65536] / accept["k26-eagle3", 2048]
    dflash_16k = accept["k26-dflash", 16384] / accept["k26-dflash", 2048]
    dflash_64k = accept["k26-dflash", 65536] / accept["k26-dflash", 2048]
    assert eagle_16k <= 0.80 and eagle_64k <= 0.50, accept
    assert dflash_16k >= 0.95 and dflash_64k >= 0.90, accept
    assert speed["k26-dflash", 16384] >= 2.0 * speed["k26-eagle3", 16384], speed


# ---------------------------------------------------------------------------- temperature


def test_temperature_one_lowers_acceptance_by_the_sourced_amounts(k26):
    """DFlash: the DDTree paper's DFlash columns give T=1/T=0 medians of 0.83 / 0.89 / 0.95 (math /
    code / chat, block 16); at block 8 the twin must stay within math <= 0.92, code <= 0.95, chat
    <= 0.98, all >= 0.80. EAGLE-3: nebius's card, 4.50 / 4.78 = 0.94: within [0.90, 0.98]. The
    tree rides the chain and loses its branching gain on top."""
    bounds = {
        "k26-dflash": {"math": (0.80, 0.92), "code": (0.80, 0.95), "chat": (0.80, 0.98)},
        "k26-eagle3": {d: (0.90, 0.98) for d in ("math", "code", "chat")},
        "k26-ddtree": {"math": (0.75, 0.90), "code": (0.75, 0.93), "chat": (0.75, 0.96)},
    }
    for name, per_domain in bounds.items():
        for domain, (low, high) in per_domain.items():
            prompts = _prompts(domain, 16)
            cold, _ = run(k26[name], prompts, 8, max_new_tokens=512, temperature=0.0)
            hot, _ = run(k26[name], prompts, 8, max_new_tokens=512, temperature=1.0)
            assert low <= hot / cold <= high, (name, domain, cold, hot)


# ---------------------------------------------------------------------------------- NGRAM


def _chat(url: str, messages: list[dict], **extra: object) -> dict:
    async def go() -> dict:
        body = {
            "model": "kimi-k2.6",
            "messages": messages,
            "temperature": 0,
            "chat_template_kwargs": {"thinking": False},
            "return_spec_tokens_details": True,
            **extra,
        }
        async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())

    return asyncio.run(go())


def _accept(answer: dict) -> float:
    return float(answer["sglext"]["spec_tokens_details"]["spec_accept_length"])


REWRITE = "Rewrite your previous answer with these edits: use shorter sentences and keep everything else."


def test_ngram_gains_when_a_turn_repeats_what_this_server_generated(k26, twin_factory):
    """SGLang 0.5.23's NGRAM drafts from a trie of the text *this server* generated (prompts are
    not inserted: `ngram_worker.py: _update_ngram_corpus`). A turn that rewrites the model's own
    previous answer on the same server gains (+112..136% on code rewrites, exllamav3#374, in a
    prompt-lookup engine); the same turn on another NGRAM server, or a rewrite of text the user
    pasted, gains what prose gains."""
    ngram = k26["k26-ngram"]
    other = twin_factory("k26-ngram")
    first = [{"role": "user", "content": "Explain how a hash map handles collisions, with an example."}]
    turn1 = _chat(ngram, first)
    answer = turn1["choices"][0]["message"]["content"]
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": REWRITE}]
    same_server = _accept(_chat(ngram, second))
    other_server = _accept(_chat(other, second))
    # ~3.2 tokens per step inside a rewrite of its own answer (70% copied at 0.92 per draft)
    # against ~1.4-1.8 on text it never generated
    assert same_server >= 1.8 * other_server, (same_server, other_server)
    # text the user pasted: the server that generated it gains nothing from it either; the
    # request draws exactly what it draws on a server that never saw it
    pasted = [
        {"role": "user", "content": "Here is a draft."},
        {"role": "assistant", "content": "Send it over."},
        {"role": "user", "content": f"{REWRITE}\n\n{' '.join(reversed(answer.split()))}"},
    ]
    assert _accept(_chat(ngram, pasted)) == pytest.approx(_accept(_chat(other, pasted)), rel=1e-9)


def test_ngram_on_prose_gains_at_most_the_published_chat_figure_and_loses_at_batch(k26):
    """On text the server has not generated before NGRAM accepts at most what TensorRT-LLM's
    n-gram accepts on first-turn chat with the prompt in its pool (1.37 tokens per step), every
    request still verifying 12 tokens: a little faster than AR alone, slower than AR once the
    batch's verify width passes the step's knee, and far behind a trained drafter."""
    prompts = _prompts("chat", 48)  # distinct: none answered twice by the NGRAM server
    accept, ngram1 = run(k26["k26-ngram"], prompts[:16], 1, max_new_tokens=256, temperature=0.0)
    _, ar1 = run(k26["k26-ar"], prompts[:16], 1, max_new_tokens=256, temperature=0.0)
    _, dflash1 = run(k26["k26-dflash"], prompts[:16], 1, max_new_tokens=256, temperature=0.0)
    assert accept <= 1.45
    assert 0.95 <= ngram1 / ar1 <= 1.40, (ngram1, ar1)
    assert ngram1 / ar1 < 0.5 * dflash1 / ar1
    _, ngram32 = run(k26["k26-ngram"], prompts[16:], 32, max_new_tokens=256, temperature=0.0)
    _, ar32 = run(k26["k26-ar"], prompts[16:], 32, max_new_tokens=256, temperature=0.0)
    assert ngram32 < ar32, (ngram32, ar32)


def test_ngram_repeats_a_greedy_answer_it_gave_before(k26):
    """SGLang's own NGRAM benchmark (sgl-project/sglang#22569): re-generating prompts whose
    outputs are already in the corpus accepts 6.64 tokens per step against 2.13 without."""
    url = k26["k26-ngram"]
    prompt = ["Describe the water cycle for a school report (repeat test)."]
    first, _ = run(url, prompt, 1, max_new_tokens=256, temperature=0.0)
    again, _ = run(url, prompt, 1, max_new_tokens=256, temperature=0.0)
    sampled, _ = run(url, prompt, 1, max_new_tokens=256, temperature=1.0)
    assert first < 2.0 and again >= 6.0 and sampled < 2.0, (first, again, sampled)


# --------------------------------------------------------------------- caps and server args


def test_speculative_caps_and_server_args_are_sglangs(k26):
    """SGLang 0.5.23 sets max_running_requests 48 on speculative servers unless it is set, and
    none on AR (`arg_groups/speculative_hook.py`); NGRAM forces mixed chunked prefill off and
    reports its trie settings; the DDTree pull request runs page size 1 without the overlap
    scheduler; draft KV shrinks the pool (`dflash_utils.py`: per-rank draft cell)."""
    info = {name: get_json(f"{url}/server_info") for name, url in k26.items()}
    assert info["k26-ar"]["max_running_requests"] is None
    for name in ("k26-eagle3", "k26-dflash", "k26-ddtree", "k26-ngram"):
        assert info[name]["max_running_requests"] == 48, name
        assert info[name]["enable_dp_attention"] is False and info[name]["attn_dp_size"] == 1
    ng = info["k26-ngram"]
    assert ng["speculative_algorithm"] == "NGRAM" and ng["speculative_draft_model_path"] is None
    assert (ng["speculative_num_draft_tokens"], ng["speculative_eagle_topk"], ng["speculative_num_steps"]) == (
        12,
        1,
        12,
    )
    assert ng["speculative_ngram_max_bfs_breadth"] == 1 and ng["speculative_ngram_capacity"] == 10_000_000
    assert ng["enable_mixed_chunk"] is False and ng["disable_overlap_schedule"] is False
    dd = info["k26-ddtree"]
    assert dd["disable_overlap_schedule"] is True and dd["page_size"] == 1 and dd["speculative_ddtree_budget"] == 9
    assert info["k26-dflash"]["page_size"] == 64 and info["k26-dflash"]["disable_overlap_schedule"] is False
    ar_pool = info["k26-ar"]["max_total_tokens"]
    assert 0.95 * ar_pool <= info["k26-dflash"]["max_total_tokens"] < ar_pool
    assert 0.98 * ar_pool <= info["k26-eagle3"]["max_total_tokens"] < ar_pool
    assert info["k26-ngram"]["max_total_tokens"] == ar_pool  # NGRAM keeps no draft KV


def test_the_49th_request_on_a_speculative_server_waits(k26):
    url = k26["k26-ngram"]

    async def flood() -> list[int]:
        async with aiohttp.ClientSession() as session:
            tasks = [
                asyncio.create_task(_generate(session, url, f"Tell me story {i}.", max_new_tokens=4000))
                for i in range(49)
            ]
            seen: list[int] = []

            def full() -> bool:
                core = get_json(f"{url}/v1/loads")["loads"][0]
                seen[:] = [core["num_running_reqs"], core["num_waiting_reqs"]]
                return seen == [48, 1]

            ok = await asyncio.to_thread(wait_until, full, 30.0)
            for t in tasks:  # the twin aborts a request whose client has gone
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return seen if ok else [-1, *seen]

    assert asyncio.run(flood()) == [48, 1]


@pytest.mark.parametrize(
    ("profile", "flags", "message"),
    [
        ("k26-ngram", ["--attn-dp-size", "8"], "Currently ngram speculative decoding does not support dp attention."),
        ("k26-ngram", ["--dp-size", "8", "--enable-dp-attention"], "does not support dp attention"),
        ("k26-dflash", ["--attn-dp-size", "8"], "DFLASH with dp attention requires --enable-dp-lm-head."),
        ("k26-dflash", ["--attn-dp-size", "8", "--enable-dp-lm-head"], "not modelled by the twin"),
    ],
)
def test_attention_data_parallelism_is_refused_as_sglang_refuses_it(profile, flags, message):
    """`_handle_ngram` refuses DP attention outright; `_handle_dflash` needs --enable-dp-lm-head
    (then SGLang starts, the twin does not model it)."""
    proc = subprocess.run(
        specroute("sim", "--profile", profile, "--port", "0", *flags), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------- load


def test_speculation_gains_less_at_batch_32_than_at_batch_1(k26):
    """DeepSeek-V3 MTP in SGLang: 1.8x at batch 1, 1.5x at batch 32 (vendor, H200): the verify
    width stops being free as the batch grows; on this PCIe profile at least as steeply."""
    prompts = _prompts("math", 32)
    _, dflash1 = run(k26["k26-dflash"], prompts[:4], 1, max_new_tokens=256, temperature=0.0)
    _, ar1 = run(k26["k26-ar"], prompts[:4], 1, max_new_tokens=256, temperature=0.0)
    _, dflash32 = run(k26["k26-dflash"], prompts, 32, max_new_tokens=256, temperature=0.0)
    _, ar32 = run(k26["k26-ar"], prompts, 32, max_new_tokens=256, temperature=0.0)
    assert dflash32 / ar32 <= 0.85 * dflash1 / ar1, (dflash1 / ar1, dflash32 / ar32)
