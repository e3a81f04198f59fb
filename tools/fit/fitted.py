"""Everything the fit makes of a sweep's measurements, before any profile format: each part fitted,
or the reason it could not be."""

from __future__ import annotations

import msgspec

from tools.fit.fit_accept import (
    AcceptFit,
    CopyFit,
    PowerLaw,
    WindowLaw,
    fit_accept,
    fit_copy,
    fit_power_law,
    fit_window_law,
)
from tools.fit.fit_lengths import LengthFit, fit_lengths, length_samples
from tools.fit.fit_prefill import PrefillFit, fit_prefill
from tools.fit.fit_step import StepFit, fit_step
from tools.fit.measurements import Measurements
from tools.fit.schema import max_accept_drafts

__all__ = ["FitResult", "fit_all"]


class FitResult(msgspec.Struct, kw_only=True):
    measurements: Measurements
    step: StepFit | None = None
    prefill: PrefillFit | None = None
    accept: AcceptFit | None = None
    window: WindowLaw | None = None  # the context law of a windowed drafter
    power: PowerLaw | None = None  # the context law of a drafter that sees the whole context
    copy: CopyFit | None = None  # NGRAM: acceptance inside copies of the server's own output
    reasoning: LengthFit | None = None
    answer: LengthFit | None = None
    unfitted: dict[str, str] = {}  # part -> why it could not be fitted

    @property
    def speculative(self) -> bool:
        c = self.measurements.facts.classification
        return c is not None and c.reported is not None

    @property
    def complete(self) -> bool:
        """Every part a profile needs was fitted (the lengths are optional: a profile without them
        runs every request to its max_tokens)."""
        return self.step is not None and self.prefill is not None and (self.accept is not None or not self.speculative)


def fit_all(m: Measurements) -> FitResult:
    out = FitResult(measurements=m)
    try:
        out.step = fit_step(m)
    except ValueError as e:
        out.unfitted["step"] = str(e)
    try:
        out.prefill = fit_prefill(m)
    except ValueError as e:
        out.unfitted["prefill"] = str(e)
    if out.speculative:
        drafts = max_accept_drafts(m.facts)
        detailed = any(r.verify_ct for lv in m.levels for r in lv.requests)
        if not detailed and any(lv.requests for lv in m.levels):
            out.unfitted["acceptance"] = (
                f"the server (SGLang {m.facts.version or '?'}) sent no per-request speculation details: acceptance "
                "is measured from `return_spec_tokens_details` (`sglext`, SGLang 0.5.23)"
            )
        elif drafts is None:
            out.unfitted["acceptance"] = (
                "the server does not report its speculative settings (the deepest run of drafts)"
            )
        else:
            try:
                out.accept = fit_accept(m, drafts)
                reported = m.facts.speculative.get("speculative_draft_window_size")
                out.window = fit_window_law(out.accept.context, reported if isinstance(reported, int) else None)
                out.power = fit_power_law(out.accept.context)
                out.copy = fit_copy(m, drafts)
            except ValueError as e:
                out.unfitted["acceptance"] = str(e)
    reasoning, answer, budget = length_samples(m)
    if not any(lv.kind == "lengths" for lv in m.levels):
        out.unfitted["lengths"] = "no lengths round was run (the sweep stopped before them)"
    else:
        if m.facts.thinking:
            try:
                out.reasoning = fit_lengths(reasoning, budget)
            except ValueError as e:
                out.unfitted["reasoning"] = str(e)
        try:
            out.answer = fit_lengths(answer, budget)
        except ValueError as e:
            out.unfitted["answer"] = str(e)
    return out
