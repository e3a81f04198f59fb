"""The one place that knows the twin's profile format: a fit's results as a profile's tables, with a
provenance entry per parameter and the list of what was not measured.

Provenance follows the profiles' own form (`kind: text`): `measured: URL, date, what it was fitted
on` for what the sweep measured or read from the server, `derived: ...` for a value that follows
from measured ones by stated arithmetic, and `assumption: not measured (why) | measure: how` for a
value the format needs that the sweep could not measure. A parameter with a default in the format
that the sweep did not measure is left out of the file (the file makes no claim about it) and named
in its header. New profile fields are added here, and nowhere else in `tools/fit`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec

from tools.fit.discover import ServerFacts
from twin.profile import Profile, SpecConfig, StepModel

if TYPE_CHECKING:  # fitted.py imports this module
    from tools.fit.fitted import FitResult

__all__ = ["Document", "max_accept_drafts", "profile_document", "spec_config"]

ProbabilityMax = 0.999  # the twin's ceiling on a per-draft acceptance
MISS_FACTOR_RANGE = (0.5, 5.0)  # the range the twin accepts for a temperature factor


class Document(msgspec.Struct, kw_only=True):
    tables: dict[str, Any]  # the profile, as TOML tables (provenance apart)
    provenance: dict[str, str]
    not_measured: list[str]  # header lines: parameters left at the format's default, and why
    findings: list[str]  # what was measured that the format has no parameter for


def _reported_int(facts: ServerFacts, key: str) -> int | None:
    v = facts.speculative.get(key)
    return v if type(v) is int and v > 0 else None


def spec_config(facts: ServerFacts) -> SpecConfig | None:
    """The twin's speculative settings for the server (None without speculation, or when the
    twin has no drafting law for its algorithm)."""
    c = facts.classification
    if c is None or c.reported is None or c.twin_algorithm is None:
        return None
    width = facts.verify_width or 0
    if width < 2:
        return None  # the server does not say how many tokens it verifies
    block = _reported_int(facts, "speculative_dflash_block_size")
    draft = facts.speculative.get("speculative_draft_model_path")
    fields: dict[str, Any] = {
        "algorithm": c.twin_algorithm,
        "draft_model_path": None if c.twin_algorithm == "NGRAM" else str(draft or ""),
        "num_steps": _reported_int(facts, "speculative_num_steps") or 1,
        "eagle_topk": _reported_int(facts, "speculative_eagle_topk") or 1,
        "num_draft_tokens": width,
        "dflash_block_size": block if c.twin_algorithm in ("DFLASH", "DDTREE") else None,
        "ddtree_budget": _reported_int(facts, "speculative_ddtree_budget") if c.twin_algorithm == "DDTREE" else None,
    }
    if "tree_gamma" in SpecConfig.__struct_fields__:
        fields["tree_gamma"] = 0.0  # the tree's own rates are measured: no transform of them
    return msgspec.convert(fields, SpecConfig)


def _stub(facts: ServerFacts, spec: SpecConfig | None) -> Profile:
    zero = StepModel(t0_ms=0, k_ms=0, knee_tokens=1, k_compute_ms=0, prefill_ms_base=0, prefill_ms_per_token=0)
    return Profile(
        name="stub",
        description="",
        strategy=(facts.classification.strategy if facts.classification else None) or "ar",  # type: ignore[arg-type]
        served_model_name="",
        model_path="",
        context_length=1,
        max_running_requests=1,
        max_total_num_tokens=1,
        tp_size=1,
        attention_backend="",
        step=zero,
        speculative=spec,
    )


def max_accept_drafts(facts: ServerFacts) -> int | None:
    """The deepest run of drafts a verify pass accepts, as the twin will simulate the server."""
    spec = spec_config(facts)
    if spec is None:
        return None
    return _stub(facts, spec).max_accept_drafts


def _r(x: float, digits: int = 4) -> float:
    """A figure to `digits` significant digits (a profile is read by people)."""
    if x == 0 or not math.isfinite(x):
        return 0.0
    return float(f"{x:.{digits}g}")


class _Writer:
    def __init__(self, fit: FitResult) -> None:
        m = fit.measurements
        self.where = f"{m.url}, {m.date}"
        self.tables: dict[str, Any] = {}
        self.provenance: dict[str, str] = {}
        self.not_measured: list[str] = []
        self.findings: list[str] = []

    def put(self, key: str, value: Any, provenance: str | None = None) -> None:
        table, _, name = key.rpartition(".")
        target = self.tables.setdefault(table, {}) if table else self.tables
        target[name] = value
        if provenance is not None:
            self.provenance[key] = provenance

    def measured(self, key: str, value: Any, what: str) -> None:
        self.put(key, value, f"measured: {self.where}, {what}")

    def assumed(self, key: str, value: Any, why: str, experiment: str) -> None:
        self.put(key, value, f"assumption: not measured by `specroute profile` ({why}) | measure: {experiment}")


def _identity(w: _Writer, fit: FitResult, name: str) -> None:
    f = fit.measurements.facts
    c = f.classification
    info = f"{f.info_path} (reported)"
    w.put("name", name)
    algo = c.reported if c is not None and c.reported else "no speculation"
    w.put(
        "description",
        f"measured from {fit.measurements.url} on {fit.measurements.date}: {f.served_model_name}, {algo}, "
        f"SGLang {f.version or '?'} ({fit.measurements.mode} sweep)",
    )
    w.put("strategy", (c.strategy if c else None) or "ar")
    w.put("served_model_name", f.served_model_name or "")
    w.put("model_path", f.model_path or f.served_model_name or "")
    if f.context_length:
        w.measured("context_length", f.context_length, "/v1/models max_model_len (reported)")
    else:
        w.assumed("context_length", 32768, "the server reports no context length", "GET /v1/models max_model_len")
    w.measured("max_running_requests", f.max_running_requests, f"{info}")
    if f.max_total_tokens:
        w.measured("max_total_num_tokens", f.max_total_tokens, "/v1/loads max_total_num_tokens (reported)")
    else:
        w.assumed(
            "max_total_num_tokens",
            (f.max_running_requests or 1) * (f.context_length or 32768),
            "the server reports no KV pool size: room for every running request at full context",
            "GET /v1/loads max_total_num_tokens (SGLang 0.5.23)",
        )
    if f.tp_size:
        w.measured("tp_size", f.tp_size, info)
    else:
        w.assumed("tp_size", 1, "not reported; it changes no figure of the twin", "GET /server_info tp_size")
    w.put("attention_backend", f.attention_backend or "unknown")


def _step(w: _Writer, fit: FitResult) -> None:
    s, p = fit.step, fit.prefill
    assert s is not None and p is not None
    width = s.width
    k = s.per_seq_ms / width
    what = s.describe()
    w.measured("step.t0_ms", _r(s.const_ms + k), f"{what}; the fixed cost of a step (target and drafter together)")
    if s.per_seq_measured:
        w.measured("step.k_ms", _r(k), f"{what}; the cost per sequence over its {width} verified token(s)")
    else:
        w.assumed(
            "step.k_ms",
            0.0,
            f"the server runs one sequence at a time (cap {fit.measurements.facts.max_running_requests}), so no "
            "batch grows; 0",
            "step time at two batch sizes or more (a server started with a larger --max-running-requests)",
        )
    if s.knee_tokens is not None:
        w.measured("step.knee_tokens", s.knee_tokens, f"{what}; where the cost per token rises")
        w.measured("step.k_compute_ms", _r(s.compute_ms_per_token), f"{what}; the extra cost per token past the knee")
    else:
        most = (fit.measurements.facts.max_running_requests or 1) * width
        if s.max_tokens_per_step >= 0.95 * most:  # the sweep ran the cap: no knee within what the server runs
            w.measured(
                "step.knee_tokens",
                max(most, s.max_tokens_per_step),
                f"{what}; no knee up to {s.max_tokens_per_step} tokens per step, the cap times the verify width",
            )
            w.measured("step.k_compute_ms", 0.0, f"{what}; no extra cost per token up to the cap")
        else:
            w.measured(
                "step.knee_tokens",
                s.max_tokens_per_step,
                f"{what}; no knee up to {s.max_tokens_per_step} tokens per step, the largest batch the sweep ran",
            )
            w.assumed(
                "step.k_compute_ms",
                0.0,
                f"no batch beyond {s.max_tokens_per_step} tokens per step was run (the cap allows {most}); 0 past it",
                "rounds at a higher concurrency (a larger KV pool, or --max-prompt-tokens and a full sweep)",
            )
    if s.kv_ns_per_token > 0 or any(pt.kv_tokens > 10_000 for pt in s.points):
        w.measured("step.kv_ns_per_token", _r(s.kv_ns_per_token), f"{what}; the cost per KV token the batch reads")
    else:
        w.not_measured.append(
            "step.kv_ns_per_token: no round held enough KV to measure its cost (raise --max-prompt-tokens); 0"
        )
    pw = p.describe()
    w.measured("step.prefill_ms_base", _r(p.base_ms), f"{pw}; a prefill step's fixed cost")
    w.measured("step.prefill_ms_per_token", _r(p.per_token_ms), f"{pw}; the cost per prompt token")
    w.measured("step.prefill_attn_ms_per_mpair", _r(p.attn_ms_per_mpair), f"{pw}; attention per million causal pairs")
    if fit.speculative:
        w.not_measured.append(
            "step.draft_ms, step.draft_ms_per_seq, step.tree_ms_per_node: inside t0_ms and k_ms (one server's step "
            "time measures the target's and the drafter's costs together)"
        )


def _context_law(fit: FitResult) -> str:
    """Which of the twin's context laws a server's drafter follows: the window law when it reports a
    draft window or drafts in blocks (DFlash's family keeps a window of the target's tokens), else the
    power law of a drafter that sees the whole context, where the profile format has it."""
    f = fit.measurements.facts
    c = f.classification
    if f.speculative.get("speculative_draft_window_size") or (
        c is not None and c.twin_algorithm in ("DFLASH", "DDTREE")
    ):
        return "window"
    return "power" if "train_context_tokens" in SpecConfig.__struct_fields__ else "window"


def _speculative(w: _Writer, fit: FitResult) -> None:
    f = fit.measurements.facts
    spec = spec_config(f)
    a = fit.accept
    assert spec is not None and a is not None
    info = f"{f.info_path} (reported)"
    w.put("speculative.algorithm", spec.algorithm)
    if spec.draft_model_path is not None:  # NGRAM has none
        w.put("speculative.draft_model_path", spec.draft_model_path)
    for key, value in (
        ("num_steps", spec.num_steps),
        ("eagle_topk", spec.eagle_topk),
        ("num_draft_tokens", spec.num_draft_tokens),
        ("dflash_block_size", spec.dflash_block_size),
        ("ddtree_budget", spec.ddtree_budget),
    ):
        if value is not None:
            w.measured(f"speculative.{key}", value, info)
    if spec.algorithm == "DDTREE" and "tree_gamma" in SpecConfig.__struct_fields__:
        w.put(
            "speculative.tree_gamma",
            0.0,
            f"derived: acceptance.* are the tree's own per-depth rates at budget {spec.ddtree_budget}, as measured; "
            "0 keeps them (another budget, `:b=` in a fleet, is not measured)",
        )
    if _context_law(fit) == "power" and fit.power is not None and fit.power.exponent > 0:
        law_p = fit.power
        bands = ", ".join(f"{n:,}: {g:.2f}" for n, g in sorted(a.context.items()))
        what = f"miss-rate factor by prompt tokens {bands} (T=0, three domains), rms {law_p.rms:.3f}"
        w.measured("speculative.train_context_tokens", law_p.trained, f"where the context law starts; {what}")
        w.measured("speculative.context_miss_exponent", _r(law_p.exponent), what)
    elif _context_law(fit) == "window" and fit.window is not None and fit.window.per_doubling > 0:
        law = fit.window
        bands = ", ".join(f"{n:,}: {g:.2f}" for n, g in sorted(a.context.items()))
        where = "reported" if law.window_reported else "fitted"
        w.measured(
            "speculative.draft_window_tokens",
            law.window,
            f"the window the context law starts at ({where}; miss-rate "
            f"factor by prompt tokens {bands}, rms {law.rms:.3f})",
        )
        w.measured(
            "speculative.window_miss_per_doubling",
            _r(law.per_doubling),
            f"miss-rate factor by prompt tokens {bands} (T=0, three domains), rms {law.rms:.3f}",
        )
    elif a.context:
        bands = ", ".join(f"{n:,}: {g:.2f}" for n, g in sorted(a.context.items()))
        w.not_measured.append(
            f"speculative.window_miss_per_doubling: no acceptance loss with context measured (miss-rate factor by "
            f"prompt tokens {bands}); 0"
        )
    else:
        w.not_measured.append("acceptance against context length: no long-prompt round (raise --max-prompt-tokens)")
    for d in ("math", "code", "chat"):
        p = min(a.accept[d], ProbabilityMax)
        w.measured(
            f"acceptance.{d}",
            _r(p),
            f"{a.describe_domain(d)}, truncated geometric law up to {a.max_drafts} drafts",
        )
    if a.spread_measured:
        w.measured(
            "acceptance.prompt_spread",
            _r(min(a.spread, 1.0), 3),
            f"the variance of {a.requests} requests' acceptance within their (domain, temperature) cells",
        )
    else:
        w.not_measured.append("acceptance.prompt_spread: too few requests per cell; 0")
    if a.temperature:
        temps = ", ".join(f"{t:g}" for t in [0.0, *a.temperatures])
        lo, hi = MISS_FACTOR_RANGE
        for d, factor in sorted(a.temperature.items()):
            cells = [c for c in a.cells if c.domain == d]
            n = sum(c.requests for c in cells)
            clipped = min(max(factor, lo), hi)
            note = f" (fitted {factor:.3f}, held to the twin's range)" if clipped != factor else ""
            w.measured(
                f"temperature.{d}",
                _r(clipped),
                f"miss rate at T={temps} over {n} requests, linear in T{note}",
            )
    else:
        w.not_measured.append("temperature: no round at a temperature above 0; acceptance taken as at T=0")
    if spec.algorithm == "NGRAM" and "ngram" in Profile.__struct_fields__:
        _ngram(w, fit)
    for d, ratio in sorted(a.thinking_miss_ratio.items()):
        w.findings.append(
            f"thinking on vs off ({d}, T=0.6): miss rate x{ratio:.2f} (the profile has no parameter for it; "
            "acceptance.* are thinking off)"
        )


def _ngram(w: _Writer, fit: FitResult) -> None:
    """NGRAM's trie: the acceptance inside copies of the server's own output, its size as reported."""
    f = fit.measurements.facts
    for key, name in (
        ("trie_capacity", "speculative_ngram_capacity"),
        ("max_trie_depth", "speculative_ngram_max_trie_depth"),
    ):
        value = f.speculative.get(name)
        if type(value) is int and value > 0:
            w.measured(f"ngram.{key}", value, f"{f.info_path} {name} (reported)")
    c = fit.copy
    if c is not None:
        w.measured(
            "ngram.copy_accept",
            _r(min(c.accept, ProbabilityMax)),
            f"{c.requests} greedy requests repeating an earlier round's prompts (each regenerates the server's own "
            f"earlier answer: {c.mean_drafts:.2f} accepted drafts a pass)",
        )
    else:
        w.assumed(
            "ngram.copy_accept",
            _r(min(fit.accept.accept["chat"] if fit.accept else 0.0, ProbabilityMax)),
            "no round repeated an earlier one; the rate on new chat text, no gain from copies",
            "greedy prompts sent twice (`specroute profile` does on an NGRAM server)",
        )
    w.not_measured.append("ngram.copy_temperature: copies measured greedy only; the twin's 1.0")


def _lengths(w: _Writer, fit: FitResult) -> None:
    f = fit.measurements.facts
    if fit.reasoning is not None:
        r = fit.reasoning
        w.put("reasoning.parser", f.reasoning_parser or "")
        for d in ("math", "code", "chat"):
            w.measured(f"reasoning.{d}", r.median[d], f"median reasoning tokens, {r.describe()}")
        w.measured("reasoning.spread", _r(r.spread, 3), f"log-normal sigma, {r.describe()}")
        w.not_measured.append("reasoning.max_tokens: the longest reasoning segment was not reached; the twin's 32768")
    elif f.thinking:
        w.not_measured.append(f"reasoning: {fit.unfitted.get('reasoning') or fit.unfitted.get('lengths')}")
    if fit.answer is not None:
        r = fit.answer
        for d in ("math", "code", "chat"):
            w.measured(f"answer.{d}", r.median[d], f"median answer tokens, {r.describe()}")
        w.measured("answer.spread", _r(r.spread, 3), f"log-normal sigma, {r.describe()}")
    else:
        w.not_measured.append(
            f"answer: {fit.unfitted.get('answer') or fit.unfitted.get('lengths')}; requests run to max_tokens"
        )
    w.not_measured.append("default_temperature: SGLang reports no generation_config default; the twin's 1.0")


def profile_document(fit: FitResult, name: str) -> Document:
    """The profile of a complete fit (`FitResult.complete`)."""
    if not fit.complete:
        raise ValueError("the fit is incomplete: " + "; ".join(f"{k}: {v}" for k, v in fit.unfitted.items()))
    w = _Writer(fit)
    _identity(w, fit, name)
    _step(w, fit)
    if fit.speculative:
        _speculative(w, fit)
    _lengths(w, fit)
    return Document(tables=w.tables, provenance=w.provenance, not_measured=w.not_measured, findings=w.findings)
