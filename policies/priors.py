"""What a policy believes about a backend before it has measured it: one prior per strategy.

The gateway knows a backend's strategy from config and nothing else about its speed, so the
goodput policy starts from these numbers and corrects them with live telemetry. They are the
calibration figures of docs/studies.md (Kimi K2.6, TP8, PCIe) where the studies state them and labelled
assumptions elsewhere; on another model or machine they are only a starting point, which is why
the estimates learn multiplicative corrections on top of them rather than trusting them.

Step time follows the linear model docs/studies.md derives from R1, R2 and R7:

    t(B, w) = t0 + k*(B*w - 1) + draft0 + draft1*(B - 1)

with B sequences in the batch (capped at `max_running`: beyond it requests queue) each verifying
w tokens. The prior deliberately has no compute knee (the studies give no figure for it): the
estimates must learn where a strategy stops paying from what the backend does.
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
    "prior_for",
    "temperature_band",
]

DOMAINS: tuple[Domain, ...] = (Domain.MATH, Domain.CODE, Domain.CHAT)
DOMAIN_INDEX: dict[Domain, int] = {d: i for i, d in enumerate(DOMAINS)}

# Acceptance is learned per cell = (domain, temperature band, context band): drafts are accepted
# less often when the target samples (temperature > 0) and, for drafters with a bounded window,
# on contexts longer than the window.
TEMPERATURE_BANDS = 3  # [0, 0.25), [0.25, 0.75), >= 0.75 (and None: SGLang's default temperature is 1.0)
CONTEXT_BANDS = 2  # prompt within the draft window, beyond it
CELLS_PER_DOMAIN = TEMPERATURE_BANDS * CONTEXT_BANDS
CELLS = len(DOMAINS) * CELLS_PER_DOMAIN
# The DFlash drafter of K2.6 is deployed with a 4096-token draft window (docs/studies.md).
LONG_CONTEXT_TOKENS = 4096


def temperature_band(temperature: float | None) -> int:
    if temperature is None:
        return 2  # SGLang's SamplingParams default is temperature 1.0
    return 0 if temperature < 0.25 else 1 if temperature < 0.75 else 2


def cell_of(d: int, temperature: float | None, prompt_tokens: int) -> int:
    """The acceptance cell of a request of domain index `d`."""
    return (d * TEMPERATURE_BANDS + temperature_band(temperature)) * CONTEXT_BANDS + (
        1 if prompt_tokens > LONG_CONTEXT_TOKENS else 0
    )


class StepPrior(msgspec.Struct, frozen=True, kw_only=True):
    """Prior step time of one decode/verify pass, seconds, as a function of the batch size."""

    t0_s: float = 0.038  # R1: 1000/26.3 ms at batch 1
    k_s: float = 0.052e-3  # R1/R2: extra seconds per verified token in the batch
    width: int = 1  # tokens verified per sequence per step (1 = autoregressive)
    draft0_s: float = 0.0  # drafter cost at batch 1
    draft1_s: float = 0.0  # drafter cost per extra sequence

    def step_s(self, batch: int) -> float:
        b = batch if batch > 1 else 1
        return self.t0_s + self.k_s * (b * self.width - 1) + self.draft0_s + self.draft1_s * (b - 1)


class StrategyPrior(msgspec.Struct, frozen=True, kw_only=True):
    """Prior acceptance (tokens per verify pass, bonus token included) per domain, step time, cap,
    prefill cost, and how acceptance changes with temperature and with a context beyond the
    drafter's window (factors on the accepted drafts, the part beyond the bonus token)."""

    accept: tuple[float, float, float]  # math, code, chat (order of DOMAINS), temperature 0, short context
    step: StepPrior
    max_running: int
    # Assumption: K2.6 prefill ~64 GFLOP per token at ~0.8 PFLOP/s effective over 8 PCIe GPUs
    # (~12k tok/s); the fixed part is one latency-bound forward (R1: 38 ms) plus scheduling.
    prefill_base_s: float = 0.040
    prefill_per_token_s: float = 0.08e-3
    # Assumption: attention costs K2.6 64 heads x (2 x 192 QK + 2 x 128 PV) x 61 layers = 2.5 MFLOP
    # per causal (query, key) pair (model card: 61 layers, 64 MLA heads), at the same ~0.8 PFLOP/s.
    prefill_pair_s: float = 3.1e-9
    # Assumption: sampling at T ~ 0.5 / T >= 0.75 keeps ~92% / ~82% of the drafts accepted at T=0
    # (lossless speculative sampling accepts min(1, p/q): fewer tokens once the target samples).
    temperature_factors: tuple[float, float, float] = (1.0, 0.92, 0.82)
    long_context_factor: float = 1.0  # drafts accepted beyond LONG_CONTEXT_TOKENS, relative


def cell_priors(prior: StrategyPrior) -> tuple[float, ...]:
    """Prior tokens per verify pass of every acceptance cell (`cell_of`)."""
    out: list[float] = []
    for a in prior.accept:
        for t in prior.temperature_factors:
            for c in (1.0, prior.long_context_factor):
                out.append(1.0 + (a - 1.0) * t * c)
    return tuple(out)


DEFAULT_PRIORS: Mapping[Strategy, StrategyPrior] = {
    # R1-R3: ~26 tok/s per request, flat to C=32. max_running: assumption (AR servers admit many).
    Strategy.AR: StrategyPrior(accept=(1.0, 1.0, 1.0), step=StepPrior(), max_running=256),
    # Assumption: EAGLE-3 with 3 steps, topk 1 (4 verified tokens); public EAGLE-3 runs accept
    # about 3 tokens per pass on math, fewer on chat; the 3-step draft head costs a few ms.
    Strategy.EAGLE3: StrategyPrior(
        accept=(3.2, 3.0, 2.6), step=StepPrior(width=4, draft0_s=0.006, draft1_s=0.03e-3), max_running=48
    ),
    # R7/R8: DFlash block 8 accepts 3.6-4.9 per dataset; the 3B drafter costs ~9.5 ms at batch 32.
    # Beyond the 4096-token draft window the drafter sees a truncated context (assumption: 85% of
    # the drafts accepted).
    Strategy.DFLASH: StrategyPrior(
        accept=(4.9, 4.2, 3.6),
        step=StepPrior(width=8, draft0_s=0.003, draft1_s=0.2e-3),
        max_running=48,
        long_context_factor=0.85,
    ),
    # Assumption: DDTree over the DFlash drafter, budget 32 (33 verified tokens), accepting about
    # 1.3x DFlash (DDTree paper: 8.22x vs 6.09x speedup); the tree adds little drafting cost.
    Strategy.DDTREE: StrategyPrior(
        accept=(6.4, 5.5, 4.7),
        step=StepPrior(width=33, draft0_s=0.003, draft1_s=0.25e-3),
        max_running=48,
        long_context_factor=0.85,
    ),
    # SGLang's NGRAM: every running request verifies 12 tokens per step, matched or not; on text
    # the server did not generate before, the published n-gram accept lengths are 1.4 (chat, with
    # the prompt in the pool) to 1.8 (SGLang's GSM8K test floor); no drafter pass, a host lookup.
    # What it gains on repeated text depends on the server's own history: the estimates learn it.
    Strategy.NGRAM: StrategyPrior(
        accept=(1.8, 1.4, 1.4),
        step=StepPrior(width=12, draft0_s=0.0005, draft1_s=0.02e-3),
        max_running=48,
    ),
}


def prior_for(strategy: Strategy | str, priors: Mapping[Strategy, StrategyPrior] = DEFAULT_PRIORS) -> StrategyPrior:
    """The prior of a strategy; an unknown strategy is treated as autoregressive (no gain assumed)."""
    try:
        return priors[Strategy(strategy)]
    except (ValueError, KeyError):
        return priors[Strategy.AR]
