"""A bundled profile with its parameters moved by 20-30%: a truth the fit was never shaped on.

`bench.profile_fit --perturb NAME` sweeps a twin of `perturbed(NAME)`: acceptance per domain lower
(a per-draft acceptance a of 0.86 becomes 0.86 x 0.8), the temperature law steeper, step costs
and prefill dearer or cheaper by 20-30%, the context law and lengths moved. Nothing in the fit
knows these numbers; a fit that only reproduced the shipped profiles would miss them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from tools.fit.render import render_profile
from tools.fit.schema import Document
from twin.profile import load_profile

__all__ = ["FACTORS", "perturbed", "write_perturbed"]

# dotted parameter -> factor; each is moved whichever way keeps the profile valid (an acceptance
# below 1, a knee a whole number of tokens)
FACTORS: dict[str, float] = {
    "step.t0_ms": 1.25,
    "step.k_ms": 1.3,
    "step.knee_tokens": 0.75,
    "step.k_compute_ms": 1.2,
    "step.prefill_ms_base": 0.8,
    "step.prefill_ms_per_token": 1.25,
    "step.kv_ns_per_token": 0.75,
    "step.prefill_attn_ms_per_mpair": 1.2,
    "step.draft_ms": 1.3,
    "step.draft_ms_per_seq": 0.75,
    "acceptance.math": 0.8,
    "acceptance.code": 0.75,
    "acceptance.chat": 0.8,
    "acceptance.prompt_spread": 1.3,
    "temperature.math": 1.2,
    "temperature.code": 1.25,
    "temperature.chat": 1.2,
    "speculative.window_miss_per_doubling": 1.3,
    "speculative.draft_window_tokens": 0.75,
    "reasoning.math": 0.75,
    "reasoning.code": 0.75,
    "reasoning.chat": 1.25,
    "answer.math": 1.25,
    "answer.code": 0.8,
    "answer.chat": 1.25,
}


def perturbed(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The bundled profile `name` as tables with FACTORS applied, and its provenance."""
    source = load_profile(name)
    raw = tomllib.loads((Path(__file__).resolve().parent.parent / "twin" / "profiles" / f"{name}.toml").read_text())
    provenance: dict[str, str] = dict(raw.pop("provenance"))
    raw["name"] = f"{source.name}-perturbed"
    raw["description"] = f"{source.description}, parameters moved 20-30% (bench/perturbed_profile.py)"
    for dotted, factor in FACTORS.items():
        table, _, key = dotted.partition(".")
        values = raw.get(table)
        if not isinstance(values, dict) or key not in values:
            continue
        old = values[key]
        new = old * factor
        if isinstance(old, int):
            values[key] = max(1, round(new))
        else:
            values[key] = round(min(new, 0.995) if table == "acceptance" else new, 6)
        provenance[dotted] = f"design: {name}'s {old!r} x {factor} (bench/perturbed_profile.py)"
    return raw, provenance


def write_perturbed(name: str, directory: Path) -> Path:
    """`perturbed(name)` written as DIR/NAME-perturbed.toml, loaded back to check it is valid."""
    tables, provenance = perturbed(name)
    path = directory / f"{tables['name']}.toml"
    header = [f"{name} with its parameters moved by bench/perturbed_profile.py: a twin the fit has not seen."]
    doc = Document(tables=tables, provenance=provenance, not_measured=[], findings=[])
    path.write_text(render_profile(doc, header))
    load_profile(str(path))
    return path
