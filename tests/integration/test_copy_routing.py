"""Copy-heavy turns over HTTP: K2.6 twins (NGRAM and EAGLE-3) behind the gateway, driven by the
openai SDK. A turn that asks for an earlier answer back goes to the NGRAM server that wrote that
answer (its trie holds it, docs/twin.md "NGRAM"), and the policy learns that server's copy speed
apart from its prose; new code goes to EAGLE-3, and so does a rewrite of an answer EAGLE-3 wrote,
which no trie holds."""

from __future__ import annotations

import collections

import openai

from policies.priors import cell_of
from tests.support import gateway, get_json, wait_until

SYSTEM = {"role": "system", "content": "You are a careful Python programmer. Answer with complete files."}
TASKS = [
    "Write a module that parses ISO-8601 dates into tuples, with unit tests for leap years.",
    "Write a small LRU cache class with get, put and an eviction callback, plus tests.",
    "Write a command-line tool that counts words per file in a directory tree, with tests.",
    "Write a function that merges overlapping intervals, with property-based tests.",
    "Write a tokenizer for arithmetic expressions with parentheses, plus tests.",
    "Write a retry decorator with exponential backoff and jitter, with tests.",
    "Write a CSV to JSON converter that streams large files, with tests.",
    "Write a binary search tree with insert, delete and in-order iteration, plus tests.",
    "Write a rate limiter using a token bucket, with tests for bursts.",
    "Write a function that pretty-prints nested dictionaries as an indented tree, with tests.",
]
REWRITE = "Rename the main function to `run` and return the full updated file, every other line as it is."
GREEDY = {"temperature": 0.0, "extra_body": {"chat_template_kwargs": {"thinking": False}}}


def _backends(twin_factory) -> list[dict]:
    return [
        {"name": "k26-ngram", "url": twin_factory("k26-ngram"), "model": "kimi-k2.6", "strategy": "ngram"},
        {"name": "k26-eagle3", "url": twin_factory("k26-eagle3"), "model": "kimi-k2.6", "strategy": "eagle3"},
    ]


def test_copy_turns_go_to_the_ngram_server_that_wrote_the_answer(tmp_path, twin_factory):
    with gateway(tmp_path, _backends(twin_factory)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)

        def ask(messages: list[dict], max_tokens: int, pin: str | None = None) -> tuple[str, str]:
            headers = {"x-specroute-backend": pin} if pin else {}
            raw = client.chat.completions.with_raw_response.create(
                model="kimi-k2.6", messages=messages, max_tokens=max_tokens, extra_headers=headers, **GREEDY
            )
            answer = raw.parse().choices[0].message.content or ""
            return raw.headers["x-specroute-backend"], answer

        copies: list[str] = []
        prose: list[str] = []
        for i, task in enumerate(TASKS):
            first = [SYSTEM, {"role": "user", "content": f"{task} (project {i})"}]
            # a session the NGRAM server served before (pinned here): its answer is in that trie
            _, answer = ask(first, 300, pin="k26-ngram")
            assert len(answer) >= 800
            backend, _ = ask([SYSTEM, {"role": "user", "content": f"{task} Use dataclasses. (variant {i})"}], 120)
            prose.append(backend)
            rewrite = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": REWRITE}]
            backend, _ = ask(rewrite, 300)
            copies.append(backend)
        # a rewrite of an answer EAGLE-3 wrote: no trie holds it, ordinary code there
        first = [
            SYSTEM,
            {"role": "user", "content": "Write a Markdown table formatter with column alignment, and tests."},
        ]
        _, answer = ask(first, 300, pin="k26-eagle3")
        elsewhere, _ = ask(
            [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": REWRITE}], 300
        )

        assert wait_until(lambda: _samples(url) >= 2 * len(TASKS))
        state = get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["backends"]

    late_copies, late_prose = collections.Counter(copies[3:]), collections.Counter(prose[3:])
    assert late_copies["k26-ngram"] >= len(copies[3:]) - 1, copies  # one exploration allowed
    assert late_prose["k26-eagle3"] >= len(prose[3:]) - 1, prose
    assert elsewhere == "k26-eagle3"
    # learned apart: NGRAM's copy cell (code, greedy, short context) well above its prose
    cells = state["k26-ngram"]["accept_length_cells"]
    code_plain, code_copy = cells[cell_of(1, 0.0, 500)], cells[cell_of(1, 0.0, 500, True)]
    assert code_copy > 2.0 * code_plain, (code_copy, code_plain)
    assert state["k26-ngram"]["accept_samples"] >= len(TASKS)


def _samples(url: str) -> float:
    """Requests the NGRAM backend's acceptance has learned from so far (outcomes land after the
    response: the test waits for them, not for time)."""
    backends = get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["backends"]
    return float(backends["k26-ngram"]["accept_samples"])
