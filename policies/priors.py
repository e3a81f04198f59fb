"""What a policy believes about a backend before it has measured it: one prior per strategy.

The gateway knows a backend's strategy from config and nothing else about its speed, so the
goodput policy starts from these numbers and corrects them with live telemetry (and, at startup,
with a measurement of each backend: `backends.measure`). They are Kimi K2.6 on TP8 over PCIe, the
figures docs/studies.md measured and docs/twin.md ("K2.6 parameters and their sources") traces to
public sources; each number below says where it comes from. On another model or machine they are
only a starting point, which is why the estimates learn multiplicative corrections on top of them.

Step time, seconds per decode/verify pass with B sequences each verifying w tokens:

    t(B, w) = t0 + k (B w - 1) + k_compute max(0, B w - knee) + draft0 + draft1 (B - 1)

B is capped at `max_running` (beyond it requests queue). The KV each pass reads (56 ns a cached
token on this machine) is not in the prior: a policy does not know its neighbours' contexts, and
the learned per-load corrections absorb it.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from backends import Strategy
from policies.base import Domain

__all__ = [
    "CELLS",
    "CELLS_PER_DOMAIN",
    "DEFAULT_PRIORS",
    "DOMAINS",
    "DOMAIN_INDEX",
    "LONG_CONTEXT_TOKENS",
    "StepPrior",
    "StrategyPrior",
    "cell_of",
    "cell_priors",
    "copy_accept_length",
    "prior_for",
    "temperature_band",
]

DOMAINS: tuple[Domain, ...] = (Domain.MATH, Domain.CODE, Domain.CHAT)
DOMAIN_INDEX: dict[Domain, int] = {d: i for i, d in enumerate(DOMAINS)}

# Acceptance is learned per cell = (domain, temperature band, context band, copy): drafts are
# accepted less often when the target samples (temperature > 0) and, for drafters with a bounded
# window, on contexts longer than the window; an NGRAM server drafts a copy-heavy turn
# (`policies.copy`) from its own trie when it generated the text copied, and nothing else does.
TEMPERATURE_BANDS = 3  # [0, 0.25), [0.25, 0.75), >= 0.75 (and None: SGLang's default temperature is 1.0)
CONTEXT_BANDS = 2  # prompt within the draft window, beyond it
COPY_BANDS = 2  # not a copy (or not on the backend that generated the text copied), a copy there
CELLS_PER_DOMAIN = TEMPERATURE_BANDS * CONTEXT_BANDS * COPY_BANDS
CELLS = len(DOMAINS) * CELLS_PER_DOMAIN
# K2.6's DFlash drafter is deployed with a 4096-token draft window (docs/studies.md) and its EAGLE-3
# head was trained on 4096-token sequences (docs/twin.md): both lose drafts beyond it.
LONG_CONTEXT_TOKENS = 4096


def temperature_band(temperature: float | None) -> int:
    if temperature is None:
        return 2  # SGLang's SamplingParams default is temperature 1.0
    return 0 if temperature < 0.25 else 1 if temperature < 0.75 else 2


def cell_of(d: int, temperature: float | None, prompt_tokens: int, copy: bool = False) -> int:
    """The acceptance cell of a request of domain index `d`; `copy`: a copy-heavy turn sent to the
    backend that generated the text it copies."""
    context = 1 if prompt_tokens > LONG_CONTEXT_TOKENS else 0
    return ((d * TEMPERATURE_BANDS + temperature_band(temperature)) * CONTEXT_BANDS + context) * COPY_BANDS + (
        1 if copy else 0
    )


class StepPrior(msgspec.Struct, frozen=True, kw_only=True):
    """Prior step time of one decode/verify pass, seconds, as a function of the batch size."""

    t0_s: float = 0.038  # R1: 1000 / 26.3 ms at batch 1
    # R2 (807.5 tok/s at C=32): (39.6 - 38.0 - 0.53 ms of KV read) / 31 extra tokens
    k_s: float = 0.034e-3
    # The all-reduces stay latency-bound up to ~256 tokens a pass (each of the 122 per-token
    # all-reduces at ~156 us until n x 14,336 B x 1.75 / 40 GB/s reaches it); past that a verified
    # token costs what a prefill token costs (0.12 ms): 0.12 - 0.034.
    knee_tokens: int = 256
    k_compute_s: float = 0.086e-3
    width: int = 1  # tokens verified per sequence per step (1 = autoregressive)
    draft0_s: float = 0.0  # drafter cost at batch 1
    draft1_s: float = 0.0  # drafter cost per extra sequence

    def step_s(self, batch: int) -> float:
        b = batch if batch > 1 else 1
        n = b * self.width
        over = n - self.knee_tokens
        return (
            self.t0_s
            + self.k_s * (n - 1)
            + (self.k_compute_s * over if over > 0 else 0.0)
            + self.draft0_s
            + self.draft1_s * (b - 1)
        )


class StrategyPrior(msgspec.Struct, frozen=True, kw_only=True):
    """Prior acceptance (tokens per verify pass, bonus token included) per domain, step time, cap,
    prefill cost, and how acceptance changes with temperature and with a context beyond
    LONG_CONTEXT_TOKENS (factors on the accepted drafts, the part beyond the bonus token)."""

    accept: tuple[float, float, float]  # math, code, chat (order of DOMAINS), temperature 0, short context
    step: StepPrior
    max_running: int
    # One latency-bound forward (R1: 38 ms) for a prompt alone; 0.12 ms a token (K2.6's prefill
    # FLOPs and the all-reduce bytes of a token over PCIe: docs/twin.md, "Context length").
    prefill_base_s: float = 0.038
    prefill_per_token_s: float = 0.12e-3
    # Attention: 1.24 ms per million causal (query, key) pairs (64 MLA heads x 61 layers, same source).
    prefill_pair_s: float = 1.24e-9
    # Drafts accepted at T in [0.25, 0.75) (K2.6 instant mode, 0.6) and T >= 0.75 (thinking, 1.0),
    # relative to greedy; per strategy below.
    temperature_factors: tuple[float, float, float] = (1.0, 0.92, 0.82)
    long_context_factor: float = 1.0  # drafts accepted beyond LONG_CONTEXT_TOKENS, relative
    # Tokens per verify pass of a copy-heavy turn (`policies.copy`) on the server that generated the
    # text it copies, per domain at temperature 0 with a short context; None: as the domain.
    copy_accept: tuple[float, float, float] | None = None


def cell_priors(prior: StrategyPrior) -> tuple[float, ...]:
    """Prior tokens per verify pass of every acceptance cell (`cell_of`)."""
    copy = prior.copy_accept or prior.accept
    out: list[float] = []
    for a, a_copy in zip(prior.accept, copy, strict=True):
        for t in prior.temperature_factors:
            for c in (1.0, prior.long_context_factor):
                out.append(1.0 + (a - 1.0) * t * c)
                out.append(1.0 + (a_copy - 1.0) * t * c)
    return tuple(out)


# NGRAM on a copy-heavy turn, from the two measurements docs/twin.md ("NGRAM") restates: inside
# text the server generated before each of its 11 drafts is accepted with p = 0.92 (SGLang's own
# NGRAM benchmark re-generating prompts whose earlier outputs are in the trie: 6.64 tokens a step
# with 8 corpus drafts), 7.9 tokens a pass; a turn that returns an earlier answer with edits copies
# 0.7 of its output (turboderp-org/exllamav3#374, +112-136% on "return the complete updated file
# with these nine edits"); elsewhere the domain's accept length. Passes split as the shares over
# the two speeds: 1 / (0.7 / 7.9 + 0.3 / a).
COPY_SHARE = 0.7
_IN_COPY_DRAFT = 0.92
_NGRAM_DRAFTS = 11


def copy_accept_length(novel: float, share: float = COPY_SHARE) -> float:
    """Tokens per verify pass of an NGRAM request whose output repeats its trie's text for `share`
    of its tokens and drafts like new text (`novel` tokens a pass) elsewhere."""
    inside = (1.0 - _IN_COPY_DRAFT ** (_NGRAM_DRAFTS + 1)) / (1.0 - _IN_COPY_DRAFT)
    return 1.0 / (share / inside + (1.0 - share) / novel)


# Where the figures come from (docs/twin.md restates every source): accept lengths are tokens per
# verify pass at T=0 on short prompts, per domain (math, code, chat); a temperature factor is the
# ratio of accepted drafts (accept length - 1) at T=0.6 / T=1.0 to T=0, from the per-domain accept
# ratios, averaged over the domains.
DEFAULT_PRIORS: Mapping[Strategy, StrategyPrior] = {
    # R1-R3: ~26 tok/s per request. SGLang caps only speculative servers at 48; an AR server's
    # request pool is max(min(KV / context x 512, 4096), 2048) (`pool_configurator.py`), its KV
    # binds first. /server_info's max_running_requests replaces it at startup.
    Strategy.AR: StrategyPrior(accept=(1.0, 1.0, 1.0), step=StepPrior(), max_running=2048),
    # K2.6 EAGLE-3 MLA head's card (3 steps, topk 1, 4 verified tokens): GSM8K 2.987 and MATH500
    # 3.245, HumanEval 3.241 and LiveCodeBench 2.706, MT-Bench 2.624. T=1: a published EAGLE-3 head
    # keeps 0.94 of its accept length (4.78 -> 4.50), K2.6's at depth 3 0.97: drafts x 0.95
    # (x 0.97 at 0.6, linear in T). Its head was trained at 4K and SGLang does not window MLA
    # EAGLE-3 drafters: misses grow as (context / 4096)^0.52 (speculators#684, Qwen3-8B 2.30 at 2K
    # -> 1.09 at 16K, shifted to a 4K head); at 12-16K, the body of the prompts past 4K in Kimi's
    # trace, the accepted drafts fall to 0.46-0.77x (chat-math): 0.6.
    # Drafting: three passes of a one-layer head, within 1.9-8 ms: 6 ms (an assumption in the bound).
    Strategy.EAGLE3: StrategyPrior(
        accept=(3.12, 2.97, 2.62),
        step=StepPrior(width=4, draft0_s=0.006, draft1_s=0.03e-3),
        max_running=48,
        temperature_factors=(1.0, 0.97, 0.95),
        long_context_factor=0.6,
    ),
    # R7/R8: DFlash block 8 accepts 4.87 / 4.25 / 3.68; the drafter costs 3 ms at batch 1 (within
    # the 1-3.7 ms of 6 layers at the target's per-layer latency) and 0.215 ms per extra sequence
    # (R7). T=1: the DDTree paper's DFlash columns (3 models x 10 datasets) put the misses at x1.25
    # / 1.15 / 1.06, an accept length of 0.88 / 0.91 / 0.95 of greedy: drafts x 0.89 (x 0.94 at
    # 0.6). Its 4096-token window loses 1.7% of the misses per doubling beyond (a sliding-window
    # drafter: 1.590 at 4K -> 1.537 at 20K): drafts x 0.97 at 16-64K.
    Strategy.DFLASH: StrategyPrior(
        accept=(4.87, 4.25, 3.68),
        step=StepPrior(width=8, draft0_s=0.003, draft1_s=0.215e-3),
        max_running=48,
        temperature_factors=(1.0, 0.94, 0.89),
        long_context_factor=0.97,
    ),
    # DDTree over the same drafter, budget 9 (10 verified tokens): an independent vLLM DDTree at
    # block 8 measured +3.5-4% tokens per pass from branching (not the paper's best-budget, batch-1
    # +33-72%), falling to 0.885 of that ratio at T=1: 1.04 x DFlash at T=0, 0.92 x at T=1, drafts
    # x 0.75 at T=1 and x 0.86 at 0.6 of its own greedy figure. Tree machinery 8.1 ms a pass (the
    # same study's attention-side items) and the overlap scheduler off (5% of a 38 ms pass, the
    # low end of SGLang's #9588): 3 + 8.1 + 1.9 ms.
    Strategy.DDTREE: StrategyPrior(
        accept=(5.06, 4.42, 3.83),
        step=StepPrior(width=10, draft0_s=0.013, draft1_s=0.215e-3),
        max_running=48,
        temperature_factors=(1.0, 0.86, 0.75),
        long_context_factor=0.97,
    ),
    # SGLang's NGRAM: every running request verifies 12 tokens per step, matched or not; on text
    # the server did not generate before, the published n-gram accept lengths are 1.4 (chat, with
    # the prompt in the pool) to 1.8 (SGLang's GSM8K test floor); no drafter pass, a host lookup
    # and one blocking copy (0.5 ms; a sync measured at 0.20 ms, a D2H at 0.32 ms). What it gains
    # on text it generated before depends on the server's own history: the estimates learn it.
    # On a copy-heavy turn sent to the server that generated the text copied: `copy_accept_length`
    # (3.9 / 3.3 / 3.3, about 2.4x the prose figures). No public measurement puts EAGLE-3, DFlash or
    # DDTree apart on copy turns (their drafters read the context, no trie): they keep their domain's.
    Strategy.NGRAM: StrategyPrior(
        accept=(1.8, 1.4, 1.4),
        step=StepPrior(width=12, draft0_s=0.0005, draft1_s=0.02e-3),
        max_running=48,
        temperature_factors=(1.0, 0.94, 0.89),
        copy_accept=(copy_accept_length(1.8), copy_accept_length(1.4), copy_accept_length(1.4)),
    ),
}


def prior_for(strategy: Strategy | str, priors: Mapping[Strategy, StrategyPrior] = DEFAULT_PRIORS) -> StrategyPrior:
    """The prior of a strategy; an unknown strategy is treated as autoregressive (no gain assumed)."""
    try:
        return priors[Strategy(strategy)]
    except (ValueError, KeyError):
        return priors[Strategy.AR]
