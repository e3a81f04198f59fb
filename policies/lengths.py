"""Expected output tokens of a request, learned from the requests that finished before it.

The cost model needs to know how long a request will decode before it can weigh decode speed
against prefill: a short answer after a long uncached history is dominated by prefill (stay where
the history is cached), a long one by decode speed (go where speculation pays). The expectation is
kept per kind of request, since a thinking answer with reasoning runs far longer than one without
and a tool call is a short JSON object: (domain, thinking on / off / server default, tools offered).
Each kind's mean is an EWMA of `completion_tokens`, with a pooled mean over all kinds standing in
until a kind has samples; `max_tokens` caps the prediction.
"""

from __future__ import annotations

from policies.base import Outcome, RequestFeatures
from policies.priors import DOMAIN_INDEX

__all__ = ["DEFAULT_OUTPUT_TOKENS", "OutputLengths"]

# The studies' K2.6 sweep generated about 512 tokens per request (docs/studies.md: 26.3 tok/s x 19.6 s).
DEFAULT_OUTPUT_TOKENS = 512.0
_ALPHA = 0.05
_MIN_SAMPLES = 5  # below this a kind borrows the pooled mean
_KINDS = 3 * 3 * 2


def _kind(f: RequestFeatures) -> int:
    thinking = 2 if f.thinking is None else int(f.thinking)
    return (DOMAIN_INDEX.get(f.domain, 2) * 3 + thinking) * 2 + int(f.tools)


class OutputLengths:
    __slots__ = ("means", "counts", "pooled", "pooled_n")

    def __init__(self, prior: float = DEFAULT_OUTPUT_TOKENS) -> None:
        self.means = [prior] * _KINDS
        self.counts = [0] * _KINDS
        self.pooled = prior
        self.pooled_n = 0

    def expected(self, f: RequestFeatures) -> float:
        k = _kind(f)
        mean = self.means[k] if self.counts[k] >= _MIN_SAMPLES else self.pooled
        cap = f.max_tokens
        return float(cap) if cap is not None and cap < mean else mean

    def observe(self, outcome: Outcome) -> None:
        f = outcome.features
        total, sequences = outcome.completion_tokens, outcome.sequences
        if f is None or outcome.error or not isinstance(total, int) or not isinstance(sequences, int):
            return
        if outcome.finish_reason == "abort":  # cut short (SGLang's /abort_request, a session's end): no length
            return
        if sequences < 1 or total < sequences:
            return
        n = total / sequences  # one answer's length
        k = _kind(f)
        self.counts[k] += 1
        a = max(_ALPHA, 1.0 / self.counts[k])
        self.means[k] += a * (n - self.means[k])
        self.pooled_n += 1
        b = max(_ALPHA, 1.0 / self.pooled_n)
        self.pooled += b * (n - self.pooled)

    def describe(self) -> dict[str, float | int]:
        return {"expected_output_tokens": round(self.pooled, 1), "output_samples": self.pooled_n}
