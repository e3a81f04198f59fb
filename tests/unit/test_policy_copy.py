"""Copy-heavy turns: the gateway's reading of them (policies.copy), the key that links such a turn
to the request whose answer it asks back, and the goodput policy's use of it (the copy cell only
on the backend that generated that answer)."""

from __future__ import annotations

import json

from backends import BackendSpec, Strategy
from gateway.openai_request import Message, parse
from gateway.reading import prefix_keys
from policies import BackendView, Domain, Goodput, Outcome, RequestFeatures
from policies.copy import MIN_SOURCE_CHARS, copy_source, rewrite_request
from policies.priors import DEFAULT_PRIORS, cell_of, cell_priors

CODE_ANSWER = "def area(r):\n    return 3.14159 * r * r\n\n" * 40  # ~1.7K characters of code
PROSE_ANSWER = "The river runs north past the old mill and the meadows beyond it. " * 20


def _chat(messages: list[dict[str, object]]) -> bytes:
    return json.dumps({"model": "m", "messages": messages}).encode()


def _messages(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(role=r, content=c) for r, c in pairs]


def test_a_rewrite_of_the_earlier_answer_is_a_copy_turn() -> None:
    history = _messages(
        ("system", "You write Python."),
        ("user", "Write a function for the area of a circle, with tests."),
        ("assistant", CODE_ANSWER),
        ("user", "Rename `area` to `circle_area` and return the full updated file."),
    )
    assert copy_source(history) == 2
    parts = [Message(role="user", content=[{"type": "text", "text": "Please rewrite the code above with type hints."}])]
    assert copy_source([*history[:3], *parts]) == 2  # content as parts
    assert rewrite_request("Apply these changes to your answer and give me the whole thing.")


def test_prose_and_questions_are_not_copy_turns() -> None:
    history = _messages(
        ("user", "Tell me about the river."),
        ("assistant", PROSE_ANSWER),
        ("user", "Which mills are still working today, and who owns them?"),
    )
    assert copy_source(history) is None
    assert not rewrite_request("What is the capital of France?")
    assert not rewrite_request("Tell me a story about a dragon.")


def test_a_rewrite_request_without_earlier_text_is_not_a_copy_turn() -> None:
    # nothing to copy: the first turn
    assert copy_source(_messages(("user", "Rewrite this function to be faster: def f(x): return x"))) is None
    # an earlier answer too short to matter
    short = _messages(("user", "Name a colour."), ("assistant", "Blue."), ("user", "Rewrite that in French."))
    assert copy_source(short) is None
    # pasted text is not in any server's trie: only the user's own message holds the source
    pasted = _messages(
        ("user", "Hi"), ("assistant", "Hello!"), ("user", "Rewrite the code below with type hints:\n" + CODE_ANSWER)
    )
    assert copy_source(pasted) is None
    # the last message is a tool result, not the user's request
    tool = _messages(("user", "Edit it."), ("assistant", CODE_ANSWER), ("tool", "Rewrite the text above."))
    assert copy_source(tool) is None


def test_an_agents_file_edit_counts_as_text_it_generated() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "edit_file", "arguments": json.dumps(CODE_ANSWER)}}
    history = [
        Message(role="user", content="Write area.py."),
        Message(role="assistant", content=None, tool_calls=[call]),
        Message(role="user", content="Now update the file you wrote: add a docstring, keep the rest as it is."),
    ]
    assert len(CODE_ANSWER) >= MIN_SOURCE_CHARS and copy_source(history) == 1


def test_the_copy_turn_names_the_request_whose_answer_it_copies() -> None:
    first = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Write a function for the area of a circle, with tests."},
    ]
    _, key1, copy1 = prefix_keys(parse(_chat(first), "chat"), None)
    assert key1 and copy1 == 0
    rewrite = [
        *first,
        {"role": "assistant", "content": CODE_ANSWER},
        {"role": "user", "content": "Rename `area` to `circle_area` and return the full updated file."},
    ]
    chain, key2, copy2 = prefix_keys(parse(_chat(rewrite), "chat"), None)
    assert copy2 == key1 and key2 not in (0, key1) and len(chain) >= 6
    # another conversation's first turn has another key; a different cache namespace too
    other = [{"role": "user", "content": "Write a function for the volume of a sphere."}]
    assert prefix_keys(parse(_chat(other), "chat"), None)[1] != key1
    assert prefix_keys(parse(_chat(first), "chat"), "style")[1] != key1
    prose = [*first, {"role": "assistant", "content": CODE_ANSWER}, {"role": "user", "content": "Why pi?"}]
    assert prefix_keys(parse(_chat(prose), "chat"), None)[2] == 0


def test_the_ngram_prior_pays_only_in_its_copy_cell() -> None:
    ngram, dflash = cell_priors(DEFAULT_PRIORS[Strategy.NGRAM]), cell_priors(DEFAULT_PRIORS[Strategy.DFLASH])
    code = 1
    plain, copy = cell_of(code, 0.0, 1000), cell_of(code, 0.0, 1000, True)
    assert ngram[plain] == 1.4 and 3.0 < ngram[copy] < 3.6  # 1 / (0.7 / 7.9 + 0.3 / 1.4)
    assert dflash[plain] == dflash[copy]  # no evidence sets other drafters apart on copies


def _views() -> list[BackendView]:
    specs = [("ngram", Strategy.NGRAM), ("eagle", Strategy.EAGLE3)]
    return [BackendView(spec=BackendSpec(name=n, url="http://x", model="m", strategy=s)) for n, s in specs]


def _first_turn(policy: Goodput, view: BackendView, key: int) -> None:
    """A turn of history `key` answered on `view` (the only candidate then)."""
    f = RequestFeatures(model="m", domain=Domain.CODE, temperature=0.0, prompt_tokens=200, prompt_key=key)
    assert policy.choose(f, [view]).backend is view
    policy.observe(Outcome(backend=view.name, domain=Domain.CODE, inflight_at_dispatch=1, features=f))


def test_goodput_sends_a_copy_turn_to_the_ngram_server_that_wrote_the_source() -> None:
    views = _views()
    policy = Goodput(seed=0, epsilon=0.0, bonus=0.0)
    prose = RequestFeatures(model="m", domain=Domain.CODE, temperature=0.0, prompt_tokens=300, prompt_key=11)
    assert policy.choose(prose, views).backend.name == "eagle"  # EAGLE-3 drafts new code better
    # a first turn ran on the NGRAM server (the only one up then): its answer is in that trie only
    _first_turn(policy, views[0], 12)
    copy = RequestFeatures(model="m", domain=Domain.CODE, temperature=0.0, prompt_tokens=900, prompt_key=13, copy_of=12)
    decision = policy.choose(copy, views)
    assert decision.backend.name == "ngram" and decision.reason.endswith("copy")
    # an answer EAGLE-3 wrote is in no trie: the copy turn is ordinary code there
    _first_turn(policy, views[1], 14)
    elsewhere = RequestFeatures(
        model="m", domain=Domain.CODE, temperature=0.0, prompt_tokens=900, prompt_key=15, copy_of=14
    )
    assert policy.choose(elsewhere, views).backend.name == "eagle"


def test_goodput_learns_copy_turns_apart_from_prose() -> None:
    views = _views()
    policy = Goodput(seed=0, epsilon=0.0, bonus=0.0)
    plain, copy = cell_of(1, 0.0, 900), cell_of(1, 0.0, 900, True)
    est = policy.estimates.register("ngram", Strategy.NGRAM)
    prior_plain, prior_copy = est.accept_at(plain), est.accept_at(copy)
    for i in range(40):
        key, source = 1000 + 2 * i, 1001 + 2 * i
        _first_turn(policy, views[0], source)
        f = RequestFeatures(
            model="m", domain=Domain.CODE, temperature=0.0, prompt_tokens=900, prompt_key=key, copy_of=source
        )
        policy.choose(f, views)
        policy.observe(
            Outcome(
                backend="ngram",
                domain=Domain.CODE,
                inflight_at_dispatch=1,
                completion_tokens=600,
                decode_s=600 / 5.0 * 0.039,
                verify_ct=120,  # 5 tokens a pass: better than the prior's copy figure
                features=f,
            )
        )
    assert est.accept_at(copy) > prior_copy * 1.2
    assert abs(est.accept_at(plain) / prior_plain - est.accept_at(copy) / prior_copy) > 0.1  # learned apart
