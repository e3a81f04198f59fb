"""Calibration rows for the twin's traffic axes, each with its source figure beside the twin's.

Engine on a virtual clock only (these are properties of the cost and acceptance model, not of
the HTTP loop). Sources:
- T1: DDTree paper (arXiv 2604.12989, liranringel/ddtree results table), DFlash columns, mean
  acceptance length at T=0 and T=1 for Qwen3-4B, Qwen3-8B and Qwen3-Coder-30B-A3B over ten
  datasets: the median T=1/T=0 ratio per domain. The twin runs the paper's block-16 drafter.
- T2, G1: rmagur1203/vllm-ddtree (independent): a tree beside a block-8 chain adds +3.5-4%
  tokens per step at T=0 and the tree/chain ratio falls 0.78 -> 0.69 at T=1 (x0.885).
- E1: the K2.6 EAGLE-3 MLA head's card (accept length per domain); E2, W1: the context laws
  (a drafter trained at 4K and not windowed; a 4096-token DFlash window), derived in the profiles
  from vllm-project/speculators#684.
- P1, P2, C1: the derivations stated in the K2.6 profiles (prefill per token and per attention
  pair, MLA KV read per token); the rows show the twin applies them end to end, chunking included.
- D1: R5 (173 tok/s) on word problems the twin classifies itself, unlike R5 where the domain is
  given: held-out prompts, none of them in the calibration sets.
- K1: SGLang's radix-cache semantics: turn 2 reuses turn 1's prompt and answer, whole blocks.
- N1: NGRAM on a greedy prompt the server answered before: its output repeats whole and each draft
  is accepted with the profile's copy acceptance (SGLang's own re-generation benchmark).
- H1: assumptions (reasoning length medians), shown so that a change of them is visible.
"""

from __future__ import annotations

from statistics import median

import msgspec

from twin.calibrate import TOLERANCE, Check
from twin.engine import Engine, tau
from twin.prefix_cache import PREFIX_BLOCK_TOKENS, chain_from_tokens
from twin.profile import Profile, load_profile
from twin.thinking import reasoning_tokens
from twin.virtual import run_closed_loop

__all__ = ["axis_checks", "HELD_OUT_WORD_PROBLEMS"]

# DDTree paper, DFlash columns: (T=0, T=1) mean acceptance length for Qwen3-4B, Qwen3-8B and
# Qwen3-Coder-30B-A3B, per dataset and its domain.
_PAPER_DFLASH_ROWS: dict[str, tuple[tuple[float, float], ...]] = {
    "math": (
        (7.72, 6.60), (7.79, 6.46), (5.58, 5.32),  # MATH-500
        (6.51, 5.99), (6.57, 5.93), (5.18, 5.08),  # GSM8K
        (7.54, 5.01), (7.46, 4.98), (5.16, 4.23),  # AIME24
        (7.37, 4.79), (7.39, 4.79), (5.13, 4.26),  # AIME25
    ),
    "code": (
        (6.62, 5.97), (6.61, 5.48), (8.02, 7.60),  # HumanEval
        (6.10, 5.56), (5.99, 5.30), (7.19, 7.03),  # MBPP
        (7.02, 6.53), (7.22, 6.61), (6.32, 5.57),  # LiveCodeBench
        (3.66, 3.07), (3.60, 2.82), (3.61, 3.16),  # SWE-bench Lite
    ),
    "chat": (
        (4.38, 4.05), (4.28, 3.77), (3.52, 3.43),  # MT-Bench
        (3.11, 2.96), (3.12, 2.94), (2.22, 2.14),  # Alpaca
    ),
}  # fmt: skip
_PAPER_DFLASH = {dom: median(t1 / t0 for t0, t1 in rows) for dom, rows in _PAPER_DFLASH_ROWS.items()}
# rmagur1203/vllm-ddtree: tokens per step beside the chain at T=0 (budget 9), and the tree/chain
# ratio at T=1 over T=0 (0.69 / 0.78, the same step time)
_TREE_GAIN = 3.329 / 3.200
_TREE_T1 = 0.69 / 0.78
# the K2.6 EAGLE-3 MLA card: (GSM8K + MATH500) / 2, (HumanEval + LiveCodeBench) / 2, MT-Bench
_EAGLE3_CARD = {"math": (2.987 + 3.245) / 2, "code": (3.241 + 2.706) / 2, "chat": 2.624}


# Word problems for D1, written for it and used nowhere else (not in virtual.DEFAULT_PROMPTS,
# not in the domain test's set).
HELD_OUT_WORD_PROBLEMS = (
    "Rosa is 4 years younger than her brother, who is 19. How old will Rosa be in 6 years?",
    "A cyclist rides 18 km in 45 minutes. At the same speed, how far does she ride in 2 hours?",
    "Notebooks cost $3.50 each. How much change does Li get from $20 after buying 4?",
    "Two pumps empty a pool in 6 hours together; one alone needs 10 hours. How long does the other pump need alone?",
    "A baker makes 96 rolls and packs them in bags of 8. He sells 9 bags. How many rolls are left?",
    "A taxi charges $4 plus $2.25 per mile. How much is a 12-mile ride?",
)


def _spec(p: Profile, **kw: object) -> Profile:
    assert p.speculative is not None
    return msgspec.structs.replace(p, speculative=msgspec.structs.replace(p.speculative, **kw))


def _rel(
    fig: str, what: str, ref: float, got: float, fmt: str = ".3f", unit: str = "", source: str = "engine"
) -> Check:
    err = abs(got - ref) / ref if ref else abs(got)
    return Check(fig, what, f"{ref:{fmt}}{unit}", f"{got:{fmt}}{unit}", err, err <= TOLERANCE, source)


def _temperature_rows(fig: str, label: str, prof: Profile, paper: dict[str, float]) -> list[Check]:
    out = []
    for dom in ("math", "code", "chat"):
        cold = run_closed_loop(prof, 8, 48, 512, domain=dom).accept_length
        hot = run_closed_loop(prof, 8, 48, 512, domain=dom, temperature=1.0).accept_length
        out.append(_rel(fig, f"{label} accept length T=1 / T=0, {dom}", paper[dom], hot / cold))
    return out


def _ttft(prof: Profile, prompt: int, cached: int = 0) -> float:
    e = Engine(prof)
    history = chain_from_tokens(cached, "h") if cached else []
    if cached:
        e.submit("warm", cached + 1, 1, prefix_blocks=history)
        while not e.idle:
            e.step()
    e.submit("q", prompt, 2, prefix_blocks=chain_from_tokens(prompt, "t", parent=history))
    t = 0.0
    while True:
        res = e.step()
        t += res.duration_s
        if any(em.rid == "q" for em in res.emissions):
            return t


def _derived_ttft(prof: Profile, new: int, cached: int) -> float:
    st = prof.step
    pairs = ((cached + new) ** 2 - cached**2) / 2
    return (st.prefill_ms_base + st.prefill_ms_per_token * new + st.prefill_attn_ms_per_mpair * pairs / 1e6) / 1000


def _tree_rows() -> list[Check]:
    """Tokens per verify of the K2.6 tree against the same drafter's chain, at T=0 and at T=1."""
    tree = load_profile("k26-ddtree")
    chain = load_profile("k26-dflash")
    out = []
    ratio = {}
    for temp in (0.0, 1.0):
        t = run_closed_loop(tree, 8, 96, 512, domain="math", temperature=temp).accept_length
        c = run_closed_loop(chain, 8, 96, 512, domain="math", temperature=temp).accept_length
        ratio[temp] = t / c
    out.append(_rel("G1", "K2.6 DDTree b9 / chain tokens per step, T=0 (vllm-ddtree)", _TREE_GAIN, ratio[0.0]))
    out.append(
        _rel("T2", "K2.6 DDTree / chain tokens per step, T=1 over T=0 (vllm-ddtree)", _TREE_T1, ratio[1.0] / ratio[0.0])
    )
    return out


def _eagle3_rows() -> list[Check]:
    prof = load_profile("k26-eagle3")
    out = []
    for dom in ("math", "code", "chat"):
        got = run_closed_loop(prof, 8, 96, 512, domain=dom).accept_length
        out.append(_rel("E1", f"K2.6 EAGLE-3 accept length, {dom} (the drafter's card)", _EAGLE3_CARD[dom], got))
    e = Engine(prof)
    spec = prof.speculative
    assert spec is not None and spec.train_context_tokens is not None
    short = e.accept_prob("math", 1, context_tokens=spec.train_context_tokens)
    long = e.accept_prob("math", 1, context_tokens=4 * spec.train_context_tokens)
    out.append(
        _rel(
            "E2",
            "EAGLE-3 miss rate x at 16k vs 4k context (derived: 4^0.52, speculators#684)",
            4**spec.context_miss_exponent,
            (1 - long) / (1 - short),
        )
    )
    return out


def _ngram_row() -> Check:
    prof = load_profile("k26-ngram")
    assert prof.ngram is not None
    e = Engine(prof)
    first = e.submit("first", 64, 512, "user: Summarize the history of Lyon.\n", temperature=0.0)
    while not e.idle:
        e.step()
    again = e.submit("again", 64, 512, "user: Summarize the history of Lyon.\n", temperature=0.0)
    while not e.idle:
        e.step()
    del first
    depth = prof.max_accept_drafts
    return _rel(
        "N1",
        f"NGRAM accept length, a greedy prompt answered before (copy p {prof.ngram.copy_accept}, {depth} drafts)",
        tau(prof.ngram.copy_accept, depth),
        again.accept_length,
        ".2f",
    )


def axis_checks() -> list[Check]:
    """Every axis row (a few seconds on the virtual clock)."""
    k26 = load_profile("k26-dflash")
    out = _temperature_rows(
        "T1", "DFlash block 16", _spec(k26, dflash_block_size=16, num_draft_tokens=16), _PAPER_DFLASH
    )
    out += _tree_rows()
    out += _eagle3_rows()
    # Prefill: 32k uncached (two 16k chunks, each a forward of its own) and a cached follow-up.
    got = _ttft(k26, 32768)
    ref = _derived_ttft(k26, 32768, 0) + k26.step.prefill_ms_base / 1000  # 2 chunks: 2 bases
    out.append(_rel("P1", "K2.6 TTFT, 32k-token uncached prompt, idle server", ref, got, ".2f", " s"))
    got = _ttft(k26, 32768, cached=30720)
    cached = (30720 // PREFIX_BLOCK_TOKENS) * PREFIX_BLOCK_TOKENS
    out.append(
        _rel(
            "P2",
            "K2.6 TTFT, same prompt with 30k tokens cached",
            _derived_ttft(k26, 32768 - cached, cached),
            got,
            ".3f",
            " s",
        )
    )
    e = Engine(load_profile("k26-ar"))
    extra = e.step_time(8, kv_tokens=8 * 32768) - e.step_time(8, kv_tokens=8 * 512)
    ref = 8 * (32768 - 512) * 70272 / (0.7 * 1792e9)
    out.append(
        _rel(
            "C1", "K2.6 step time added by 8 x 32k-token contexts (MLA KV read)", ref * 1000, extra * 1000, ".1f", " ms"
        )
    )
    lv = run_closed_loop(
        load_profile("qwen36-ddtree-b15"), 1, len(HELD_OUT_WORD_PROBLEMS), 512, prompts=HELD_OUT_WORD_PROBLEMS
    )
    out.append(
        _rel(
            "D1",
            "R5 on held-out word problems, domain read by the twin",
            173.0,
            lv.mean_request_output_throughput,
            ".1f",
        )
    )
    out.append(_cache_row())
    out.append(_ngram_row())
    model = k26.reasoning
    assert model is not None
    for dom in ("math", "code", "chat"):
        med = median(reasoning_tokens(model, dom, k) for k in range(1, 2002))
        out.append(
            _rel(
                "H1", f"K2.6 median reasoning tokens, {dom} (assumption)", float(getattr(model, dom)), float(med), ".0f"
            )
        )
    e = Engine(k26)
    short = e.accept_prob("code", 1, context_tokens=4096)
    long = e.accept_prob("code", 1, context_tokens=32768)
    ref_miss = 1 + 3 * (k26.speculative.window_miss_per_doubling if k26.speculative else 0)
    out.append(
        _rel(
            "W1",
            "DFlash miss rate x at 32k vs 4k context (derived: +1.7%/doubling, speculators#684)",
            ref_miss,
            (1 - long) / (1 - short),
        )
    )
    return out


def _cache_row() -> Check:
    e = Engine(load_profile("k26-ar"))
    turn1 = chain_from_tokens(3000, "s")
    e.submit("t1", 3000, 400, prefix_blocks=turn1)
    while not e.idle:
        e.step()
    answered = chain_from_tokens(3400, "s-a", parent=turn1)
    e.cache_output(answered)
    r2 = e.submit("t2", 3600, 4, prefix_blocks=chain_from_tokens(3600, "s-2", parent=answered))
    while not e.idle:
        e.step()
    ref = (3400 // PREFIX_BLOCK_TOKENS) * PREFIX_BLOCK_TOKENS
    return _rel(
        "K1",
        "turn-2 cached tokens = turn 1's prompt + answer, whole 64-token blocks",
        float(ref),
        float(r2.cached_tokens),
        ".0f",
    )
