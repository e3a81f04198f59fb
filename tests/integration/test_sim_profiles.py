"""Twin profiles answer to evidence: typed, in range, every number's kind and source, the report."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support import REPO, specroute
from twin.engine import Engine
from twin.ngram import BLOCK_WORDS, NgramMemory, copy_source, echo_share, fingerprints
from twin.profile import ProfileError, list_profiles, load_profile
from twin.provenance import Kind, count, is_order_deciding, parse, table

K26 = ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "k26-ngram")


def _variant(tmp_path, name: str, old: str, new: str) -> str:
    src = (REPO / "twin" / "profiles" / f"{name}.toml").read_text()
    assert old in src, old
    path = tmp_path / f"{name}-variant.toml"
    path.write_text(src.replace(old, new, 1))
    return str(path)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("knee_tokens = 256\n", "knee_tokens = 256\nknee_bytes = 3\n", "knee_bytes"),  # unknown key
        ("[acceptance]\nmath = 0.8607", "[acceptance]\nmath = 1.2", r"\$\.acceptance\.math"),  # p > 0.999
        ("t0_ms = 38.0", "t0_ms = -1.0", r"\$\.step\.t0_ms"),  # negative time
        ("window_miss_per_doubling = 0.017", "window_miss_per_doubling = 7.0", "window_miss_per_doubling"),
        ("[temperature]\nmath = 1.25", "[temperature]\nmath = 0.1", r"\$\.temperature\.math"),
        ('algorithm = "DFLASH"', 'algorithm = "MEDUSA"', r"\$\.speculative\.algorithm"),
        ('strategy = "dflash"', 'strategy = "eagle3"', "needs speculative.algorithm EAGLE3"),
        ("max_running_requests = 48\n", "max_running_requests = 0\n", "max_running_requests"),
    ],
)
def test_a_profile_with_an_unknown_key_or_a_value_out_of_range_is_refused_naming_it(tmp_path, old, new, named):
    with pytest.raises(ProfileError, match=named):
        load_profile(_variant(tmp_path, "k26-dflash", old, new))


def test_provenance_must_parse_name_real_parameters_and_give_assumptions_an_experiment(tmp_path):
    with pytest.raises(ProfileError, match=re.escape("provenance of step.knee_tokens: expected '<kind>: ...'")):
        load_profile(_variant(tmp_path, "k26-ar", '"step.knee_tokens" = "derived:', '"step.knee_tokens" = "guess:'))
    with pytest.raises(ProfileError, match=re.escape("parameters the file does not set: step.draft_ms")):
        load_profile(_variant(tmp_path, "k26-ar", "[provenance]\n", '[provenance]\n"step.draft_ms" = "source: x"\n'))
    # an order-deciding assumption without the experiment that would measure it
    with pytest.raises(
        ProfileError, match=re.escape("provenance of step.draft_ms: an order-deciding assumption must name")
    ):
        load_profile(
            _variant(
                tmp_path,
                "k26-dflash",
                '"step.draft_ms" = "assumption: one pass of the 6-layer 3B drafter',
                '"step.draft_ms" = "assumption: a pass | no experiment" #',
            )
        )
    # ... while a workload assumption needs none
    assert parse("reasoning.max_tokens", "assumption: capped").kind is Kind.ASSUMPTION
    assert parse("step.draft_ms", "assumption: x | measure: y").measure == "y"
    assert is_order_deciding("acceptance.math") and is_order_deciding("speculative.tree_gain")
    assert not is_order_deciding("acceptance.prompt_spread") and not is_order_deciding("answer.chat")


# What the K2.6 profiles still assume among the numbers that order the strategies: drafter and
# tree costs the studies did not time, and NGRAM's figures no public table gives. Each names its
# experiment (enforced by load_profile); adding one makes this test fail until it is listed.
OPEN_K26 = {
    "k26-ar": set(),
    "k26-eagle3": {"step.draft_ms", "step.draft_ms_per_seq"},
    "k26-dflash": {"step.draft_ms"},
    "k26-ddtree": {"step.draft_ms", "step.tree_ms_per_node"},
    "k26-ngram": {
        "acceptance.code",
        "ngram.copy_temperature",
        "step.draft_ms",
        "step.draft_ms_per_seq",
        "temperature.math",
        "temperature.code",
        "temperature.chat",
    },
}


def test_no_k26_order_deciding_parameter_rests_on_an_assumption_without_its_experiment():
    for name in K26:
        entries = load_profile(name).provenance_entries()
        c = count(name, entries)
        assert set(c.open_order_deciding) == OPEN_K26[name], name
        assert all(entries[p].measure for p in c.open_order_deciding), name


def test_the_provenance_report_counts_every_profile_and_docs_carry_it():
    out = subprocess.run(specroute("sim", "--list", "--provenance"), capture_output=True, text=True, check=True).stdout
    counts = [count(p.name, p.provenance_entries()) for p in list_profiles()]
    assert out.strip() == table(counts)
    for c in counts:
        assert c.total == c.sourced + c.derived + c.assumed + c.design
    docs = (REPO / "docs" / "twin.md").read_text()
    assert table(counts) in docs, "docs/twin.md: regenerate the table with `specroute sim --list --provenance`"
    one = subprocess.run(
        specroute("sim", "--list", "--provenance", "--profile", "k26-ddtree"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "* speculative.tree_gain" in one and "measure:" in one and "order-deciding (*)" in one


# ------------------------------------------------------------------------------ NGRAM model


def test_ngram_memory_recalls_what_it_generated_within_its_horizon_and_stays_bounded():
    text = " ".join(f"w{i}" for i in range(40 * BLOCK_WORDS))
    blocks = fingerprints(text)
    assert len(blocks) == 40 and fingerprints("  " + text.replace(" ", "\n") + "  ") == blocks
    mem = NgramMemory(horizon_tokens=1000)
    mem.remember_text(blocks)
    assert mem.recall(blocks) == 1.0 and mem.recall(blocks[:10] + fingerprints("a b c d e f g h")) == 10 / 11
    mem.generated(999)
    assert mem.recall(blocks) == 1.0
    mem.generated(2)  # older than the horizon: the trie has evicted it
    assert mem.recall(blocks) == 0.0 and len(mem) == 0
    for i in range(10_000):
        mem.remember_text([i])
        mem.generated(BLOCK_WORDS)
    assert len(mem) <= 1000 // BLOCK_WORDS + 1


def test_copy_source_is_the_answer_a_rewrite_asks_back():
    turns = [("user", "Explain TCP."), ("assistant", "TCP is a protocol."), ("user", "Rewrite it shorter.")]
    assert copy_source(turns) == "TCP is a protocol."
    assert copy_source([*turns[:2], ("user", "Thanks, what about UDP?")]) is None
    assert copy_source([("user", "Fix this code: def f(): pass")]) is None  # pasted, never generated
    assert echo_share(1.0, 300, 300) == pytest.approx(0.7)
    assert echo_share(1.0, 300, 1200) == pytest.approx(0.7 / 4)  # reasoning first dilutes it
    assert echo_share(0.0, 300, 300) == 0.0


def test_ngram_engine_draws_copies_only_from_its_own_history():
    prof = load_profile("k26-ngram")
    e = Engine(prof)
    fresh = e.submit("a", 64, 400, "user: Write about rivers.\n", temperature=0.0)
    copy = e.submit("b", 64, 400, "user: Rewrite about rivers.\n", temperature=0.0, echo=0.7)
    while not e.idle:
        e.step()
    assert fresh.accept_length < 1.6 < 2.5 < copy.accept_length
    # a greedy prompt it answered before repeats its output whole
    again = e.submit("c", 64, 400, "user: Write about rivers.\n", temperature=0.0)
    while not e.idle:
        e.step()
    assert again.accept_length > 6.0
    # other strategies ignore echo entirely
    d = Engine(load_profile("k26-dflash"))
    assert d.ngram_memory is None
    r1 = d.submit("x", 64, 200, "user: Write about rivers.\n", echo=1.0)
    r2 = Engine(load_profile("k26-dflash")).submit("x", 64, 200, "user: Write about rivers.\n")
    assert r1.accept_p == r2.accept_p and r1.copy_steps == 0.0
