"""Calibration rows for the twin's traffic axes, each with its source figure beside the twin's.

Engine on a virtual clock only (these are properties of the cost and acceptance model, not of
the HTTP loop). Sources:
- T1, T2: DDTree paper (arXiv 2604.12989) Table 1, mean acceptance length at T=0 and T=1 on
  Qwen3-4B/8B: the T=1/T=0 ratio per domain (MATH-500 + GSM8K, HumanEval + MBPP, MT-Bench +
  Alpaca). The twin runs the paper's setting: a block-16 drafter, DDTree at budget 128 (the
  paper takes the best of 16..1024; 128 gives its T=0 length of ~11 on math).
- P1, P2, C1: the derivations stated in the K2.6 profiles (prefill per token and per attention
  pair, MLA KV read per token); the rows show the twin applies them end to end, chunking included.
- D1: R5 (173 tok/s) on word problems the twin classifies itself, unlike R5 where the domain is
  given: held-out prompts, none of them in the calibration sets.
- K1: SGLang's radix-cache semantics: turn 2 reuses turn 1's prompt and answer, whole blocks.
- H1, W1: assumptions (reasoning length medians, drafter window penalty), shown so that a change
  of them is visible.
"""

from __future__ import annotations

from statistics import median

import msgspec

from twin.calibrate import TOLERANCE, Check
from twin.engine import Engine
from twin.prefix_cache import PREFIX_BLOCK_TOKENS, chain_from_tokens
from twin.profile import Profile, load_profile
from twin.thinking import reasoning_tokens
from twin.virtual import run_closed_loop

__all__ = ["axis_checks", "HELD_OUT_WORD_PROBLEMS"]

# DDTree paper Table 1, T=1/T=0 ratio of mean acceptance length, mean over Qwen3-4B and -8B
# and the domain's two datasets.
_PAPER_DFLASH = {
    "math": (6.60 / 7.72 + 5.99 / 6.51 + 6.46 / 7.79 + 5.93 / 6.57) / 4,
    "code": (5.97 / 6.62 + 5.56 / 6.10 + 5.48 / 6.61 + 5.30 / 5.99) / 4,
    "chat": (4.05 / 4.38 + 2.96 / 3.11 + 3.77 / 4.28 + 2.94 / 3.12) / 4,
}
_PAPER_DDTREE = {
    "math": (9.61 / 10.71 + 8.87 / 9.33 + 9.54 / 10.73 + 8.95 / 9.54) / 4,
    "code": (9.18 / 9.44 + 8.72 / 9.16 + 8.59 / 9.67 + 8.34 / 9.07) / 4,
    "chat": (6.27 / 6.70 + 4.97 / 5.35 + 6.02 / 6.58 + 4.89 / 5.09) / 4,
}

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


def axis_checks() -> list[Check]:
    """Every axis row (about a second on the virtual clock)."""
    k26 = load_profile("k26-dflash")
    out = _temperature_rows(
        "T1", "DFlash block 16", _spec(k26, dflash_block_size=16, num_draft_tokens=16), _PAPER_DFLASH
    )
    ddtree = _spec(load_profile("k26-ddtree"), dflash_block_size=16, ddtree_budget=128, num_draft_tokens=129)
    out += _temperature_rows("T2", "DDTree b128 over block 16", ddtree, _PAPER_DDTREE)
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
            "DFlash miss rate x at 32k vs 4k context (assumption: +10%/doubling)",
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
