"""Twin profiles: the parameters of one simulated SGLang server, loaded from `profiles/*.toml`.

A profile is data, not code, so that every number can carry its provenance (a study figure
R1..R8 of docs/studies.md, a public figure, or an explicit assumption) next to it and be reviewed
without reading the engine. `load_profile` refuses a profile whose numeric parameters lack a
provenance entry: calibration is only as trustworthy as the sources it can name.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from backends.descriptor import Strategy
from twin.answers import AnswerModel
from twin.sampling import TemperatureModel
from twin.thinking import ReasoningModel

__all__ = [
    "AcceptanceModel",
    "ProfileError",
    "Profile",
    "SpecConfig",
    "StepModel",
    "Strategy",
    "ReasoningModel",
    "TemperatureModel",
    "list_profiles",
    "load_profile",
    "numeric_parameters",
    "profile_names",
]


class ProfileError(ValueError):
    """A profile is missing, malformed, or has a parameter without provenance."""


class StepModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Cost of one engine step, in milliseconds.

    decode/verify: t(B, w) = t0 + k*(B*w - 1) + k_compute*max(0, B*w - knee) + draft(B)
                             + kv_ns_per_token * (KV tokens of the batch)
    with draft(B) = draft_ms + draft_ms_per_seq*(B - 1) + tree_ms_per_node*B*(w - 1)
    (draft terms only on speculative profiles). Prefill of n new tokens after c cached ones:
    prefill_ms_base (alone only) + prefill_ms_per_token*n + prefill_attn_ms_per_mpair*pairs/1e6
    with pairs = ((c + n)**2 - c**2) / 2 causal (query, key) pairs.
    """

    t0_ms: float
    k_ms: float
    knee_tokens: int
    k_compute_ms: float
    prefill_ms_base: float
    prefill_ms_per_token: float
    draft_ms: float = 0.0
    draft_ms_per_seq: float = 0.0
    tree_ms_per_node: float = 0.0
    # Reading the batch's KV cache each decode/verify step: ns per cached token (0 = ignored).
    kv_ns_per_token: float = 0.0
    # Prefill attention grows with (query, key) pairs: ms per million causal pairs.
    prefill_attn_ms_per_mpair: float = 0.0


class AcceptanceModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-position probability that the next draft token is accepted, per prompt domain.

    Accepted drafts per verify step follow a truncated geometric law: P(a >= j) = p**j, capped
    at the strategy's maximum depth. `prompt_spread` is the per-prompt variation: each prompt's
    miss rate (1 - p) is scaled by exp(s) with s uniform in [-spread, +spread].
    """

    math: float
    code: float
    chat: float
    prompt_spread: float = 0.0


class SpecConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Speculative settings as SGLang would report them, plus the DDTree tree model."""

    algorithm: str  # EAGLE3 | DFLASH | DDTREE (the resolved `speculative_algorithm`)
    draft_model_path: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    dflash_block_size: int | None = None
    ddtree_budget: int | None = None
    # DDTree: extra nodes beyond the chain shrink the per-depth miss rate by (depth/budget)**gamma.
    tree_gamma: float = 0.5
    # Hybrid (Mamba/GDN) targets: budgets above this lose acceptance (sibling state corruption).
    exact_budget: int | None = None
    collapse_per_node: float = 0.0
    # DFlash/DDTree drafters see at most this many context tokens (--speculative-draft-window-size)
    draft_window_tokens: int | None = None
    # miss-rate increase per doubling of the context beyond the window (sampling.py)
    window_miss_per_doubling: float = 0.0


class Profile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One simulated server: identity (what /server_info reports), costs and acceptance."""

    name: str
    description: str
    strategy: Strategy
    served_model_name: str
    model_path: str
    context_length: int
    max_running_requests: int
    max_total_num_tokens: int
    tp_size: int
    attention_backend: str
    step: StepModel
    speculative: SpecConfig | None = None
    acceptance: AcceptanceModel | None = None
    temperature: TemperatureModel | None = None  # acceptance vs sampling temperature
    reasoning: ReasoningModel | None = None  # a thinking model behind a reasoning parser
    answer: AnswerModel | None = None  # where the model ends an answer (EOS) unless ignore_eos; None: never
    # Temperature when a request sets none: SGLang's protocol default (1.0) unless the model's
    # generation_config.json says otherwise (entrypoints/openai/protocol.py).
    default_temperature: float = 1.0
    provenance: dict[str, str] = {}

    @property
    def is_speculative(self) -> bool:
        return self.speculative is not None

    @property
    def verify_width(self) -> int:
        """Tokens each running sequence verifies per step (1 for AR)."""
        spec = self.speculative
        if spec is None:
            return 1
        if spec.algorithm == "DDTREE":
            return (spec.ddtree_budget or 0) + 1
        return spec.num_draft_tokens

    @property
    def max_accept_drafts(self) -> int:
        """Deepest accepted draft run per step: block-1 (DFlash), steps (EAGLE), tree depth."""
        spec = self.speculative
        if spec is None:
            return 0
        if spec.algorithm == "DDTREE":
            depth = (spec.dflash_block_size or spec.num_draft_tokens) - 1
            return min(spec.ddtree_budget or 0, depth)
        if spec.algorithm == "DFLASH":
            return (spec.dflash_block_size or spec.num_draft_tokens) - 1
        return spec.num_steps

    def with_budget(self, budget: int) -> Profile:
        """The same profile with another DDTree node budget (verify width budget+1)."""
        if self.speculative is None or self.speculative.algorithm != "DDTREE":
            raise ProfileError(f"profile {self.name} is not a DDTree profile")
        spec = msgspec.structs.replace(self.speculative, ddtree_budget=budget, num_draft_tokens=budget + 1)
        return msgspec.structs.replace(self, speculative=spec)


def _profiles_dir() -> Path:
    return Path(str(resources.files("twin") / "profiles"))


def profile_names() -> list[str]:
    """Names of the bundled profiles, sorted."""
    return sorted(p.stem for p in _profiles_dir().glob("*.toml"))


def numeric_parameters(raw: dict[str, Any]) -> list[str]:
    """Dotted names of the numeric parameters a profile file sets (the ones needing provenance).

    Defaults that a file does not set are not listed: a parameter the file does not state is
    not a claim that needs a source.
    """
    out: list[str] = []

    def walk(prefix: str, table: dict[str, Any]) -> None:
        for key, val in table.items():
            if prefix == "" and key == "provenance":
                continue
            if isinstance(val, dict):
                walk(f"{prefix}{key}.", val)
            elif isinstance(val, (int, float)) and not isinstance(val, bool):
                out.append(f"{prefix}{key}")

    walk("", raw)
    return out


def load_profile(name_or_path: str) -> Profile:
    """Load a bundled profile by name, or a profile file by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = _profiles_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(profile_names())
        raise ProfileError(f"unknown profile {name_or_path!r} (known: {known})")
    try:
        raw = tomllib.loads(path.read_text())
        profile = msgspec.convert(raw, Profile)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
        raise ProfileError(f"{path.name}: {e}") from None
    missing = [k for k in numeric_parameters(raw) if k not in profile.provenance]
    if missing:
        raise ProfileError(f"{path.name}: parameters without provenance: {', '.join(missing)}")
    return profile


def list_profiles() -> list[Profile]:
    """All bundled profiles."""
    return [load_profile(n) for n in profile_names()]
