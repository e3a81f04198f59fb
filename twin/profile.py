"""Twin profiles: the parameters of one simulated SGLang server, loaded from `profiles/*.toml`.

A profile is data, not code, so that every number can carry its provenance (a public figure, a
study figure R1..R8 of docs/studies.md, stated arithmetic, or an explicit assumption:
`provenance.py`) next to it and be reviewed without reading the engine. `load_profile` refuses
a profile with an unknown key, a value outside its physical range (both named by msgspec's
path, e.g. `$.step.t0_ms`), a numeric parameter without provenance, a provenance entry for a
parameter the file does not set, and an order-deciding assumption that names no experiment.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from backends.descriptor import Strategy
from twin.answers import AnswerModel
from twin.provenance import Provenance, ProvenanceError
from twin.provenance import parse as parse_provenance
from twin.sampling import TemperatureModel
from twin.thinking import ReasoningModel

__all__ = [
    "AcceptanceModel",
    "NgramModel",
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
    """A profile is missing, malformed, out of its physical range, or has a parameter without provenance."""


# Physical ranges (msgspec refuses a value outside them, naming the field).
Ms = Annotated[float, msgspec.Meta(ge=0.0, le=10_000.0)]  # a duration in milliseconds
Tokens = Annotated[int, msgspec.Meta(ge=1)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=0.999)]  # per-draft acceptance
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Algorithm = Literal["EAGLE3", "DFLASH", "DDTREE", "NGRAM"]


class StepModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Cost of one engine step, in milliseconds.

    decode/verify: t(B, w) = t0 + k*(B*w - 1) + k_compute*max(0, B*w - knee) + draft(B)
                             + kv_ns_per_token * (KV tokens of the batch)
    with draft(B) = draft_ms + draft_ms_per_seq*(B - 1) + tree_step_ms + tree_ms_per_node*B*(w - 1)
    (draft terms only on speculative profiles). Prefill of n new tokens after c cached ones:
    prefill_ms_base (alone only) + prefill_ms_per_token*n + prefill_attn_ms_per_mpair*pairs/1e6
    with pairs = ((c + n)**2 - c**2) / 2 causal (query, key) pairs.
    """

    t0_ms: Ms
    k_ms: Ms
    knee_tokens: Tokens
    k_compute_ms: Ms
    prefill_ms_base: Ms
    prefill_ms_per_token: Ms
    draft_ms: Ms = 0.0
    draft_ms_per_seq: Ms = 0.0
    # DDTree: the tree machinery's fixed cost per step (host tree walk, mask, tree positions)
    tree_step_ms: Ms = 0.0
    tree_ms_per_node: Ms = 0.0
    # Reading the batch's KV cache each decode/verify step: ns per cached token (0 = ignored).
    kv_ns_per_token: Annotated[float, msgspec.Meta(ge=0.0, le=100_000.0)] = 0.0
    # Prefill attention grows with (query, key) pairs: ms per million causal pairs.
    prefill_attn_ms_per_mpair: Ms = 0.0


class AcceptanceModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-position probability that the next draft token is accepted, per prompt domain.

    Accepted drafts per verify step follow a truncated geometric law: P(a >= j) = p**j, capped
    at the strategy's maximum depth. `prompt_spread` is the per-prompt variation: each prompt's
    miss rate (1 - p) is scaled by exp(s) with s uniform in [-spread, +spread]. On an NGRAM
    server these are the rates on text the server has not generated before (`NgramModel`).
    """

    math: Probability
    code: Probability
    chat: Probability
    prompt_spread: Fraction = 0.0


class SpecConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Speculative settings as SGLang would report them, plus the laws that bend acceptance."""

    algorithm: Algorithm  # the resolved `speculative_algorithm`
    num_steps: Tokens
    eagle_topk: Tokens
    num_draft_tokens: Annotated[int, msgspec.Meta(ge=2)]
    draft_model_path: str | None = None  # None: NGRAM drafts from its own trie
    dflash_block_size: Annotated[int, msgspec.Meta(ge=2)] | None = None
    ddtree_budget: Tokens | None = None
    # DDTree: tokens per verify of the tree relative to the same drafter's chain, minus 1, at
    # T=0 once the budget leaves room for siblings beside the spine; at T=1 the ratio is
    # multiplied by `tree_t1_factor` (linear in between).
    tree_gain: Annotated[float, msgspec.Meta(ge=-0.5, le=1.0)] = 0.0
    tree_t1_factor: Annotated[float, msgspec.Meta(gt=0.0, le=2.0)] = 1.0
    # DDTree: the pull request turns SGLang's overlap scheduler off; this share of the step is
    # no longer hidden behind the previous step's host work.
    no_overlap_loss: Fraction = 0.0
    # Hybrid (Mamba/GDN) targets: budgets above this lose acceptance (sibling state corruption).
    exact_budget: Tokens | None = None
    collapse_per_node: Fraction = 0.0
    # DFlash/DDTree drafters see at most this many context tokens (--speculative-draft-window-size)
    draft_window_tokens: Tokens | None = None
    # miss-rate increase per doubling of the context beyond the window (sampling.py)
    window_miss_per_doubling: Fraction = 0.0
    # A drafter trained on sequences of this length and not windowed: beyond it the miss rate
    # grows as (context / train_context_tokens) ** context_miss_exponent (sampling.py)
    train_context_tokens: Tokens | None = None
    context_miss_exponent: Annotated[float, msgspec.Meta(ge=0.0, le=4.0)] = 0.0


class NgramModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """SGLang's NGRAM drafter: a trie of the text the server itself generated (`ngram.py`).

    Inside output that repeats text still in the trie, each draft is accepted with
    `copy_accept`; elsewhere the profile's `[acceptance]` applies. The trie keeps
    `trie_capacity` nodes and adds up to `max_trie_depth` per generated token, so it holds at
    least the last trie_capacity / max_trie_depth generated tokens.
    """

    copy_accept: Probability
    copy_temperature: Annotated[float, msgspec.Meta(ge=0.5, le=5.0)] = 1.0  # miss-rate factor at T=1 in copies
    trie_capacity: Tokens = 10_000_000  # --speculative-ngram-capacity
    max_trie_depth: Tokens = 18  # --speculative-ngram-max-trie-depth

    @property
    def horizon_tokens(self) -> int:
        return max(1, self.trie_capacity // self.max_trie_depth)


class Profile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One simulated server: identity (what /server_info reports), costs and acceptance."""

    name: str
    description: str
    strategy: Strategy
    served_model_name: str
    model_path: str
    context_length: Tokens
    max_running_requests: Tokens
    max_total_num_tokens: Tokens
    tp_size: Tokens
    attention_backend: str
    step: StepModel
    speculative: SpecConfig | None = None
    acceptance: AcceptanceModel | None = None
    temperature: TemperatureModel | None = None  # acceptance vs sampling temperature
    ngram: NgramModel | None = None  # NGRAM servers only
    reasoning: ReasoningModel | None = None  # a thinking model behind a reasoning parser
    answer: AnswerModel | None = None  # where the model ends an answer (EOS) unless ignore_eos; None: never
    # Temperature when a request sets none: SGLang's protocol default (1.0) unless the model's
    # generation_config.json says otherwise (entrypoints/openai/protocol.py).
    default_temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] = 1.0
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
        """Deepest accepted draft run per step: block-1 (DFlash), steps (EAGLE), tree depth,
        draft tokens - 1 (NGRAM: a deep trie match is a chain)."""
        spec = self.speculative
        if spec is None:
            return 0
        if spec.algorithm == "DDTREE":
            depth = (spec.dflash_block_size or spec.num_draft_tokens) - 1
            return min(spec.ddtree_budget or 0, depth)
        if spec.algorithm == "DFLASH":
            return (spec.dflash_block_size or spec.num_draft_tokens) - 1
        if spec.algorithm == "NGRAM":
            return spec.num_draft_tokens - 1
        return spec.num_steps

    def with_budget(self, budget: int) -> Profile:
        """The same profile with another DDTree node budget (verify width budget+1)."""
        if self.speculative is None or self.speculative.algorithm != "DDTREE":
            raise ProfileError(f"profile {self.name} is not a DDTree profile")
        spec = msgspec.structs.replace(self.speculative, ddtree_budget=budget, num_draft_tokens=budget + 1)
        return msgspec.structs.replace(self, speculative=spec)

    def provenance_entries(self) -> dict[str, Provenance]:
        """The parsed `[provenance]` entries (validated when the profile was loaded)."""
        return {name: parse_provenance(name, text) for name, text in self.provenance.items()}


_ALGORITHM_OF = {
    Strategy.EAGLE3: "EAGLE3",
    Strategy.DFLASH: "DFLASH",
    Strategy.DDTREE: "DDTREE",
    Strategy.NGRAM: "NGRAM",
}


def _check_consistent(p: Profile) -> None:
    """What the schema alone cannot say: the parts a strategy needs, and nothing it cannot use."""
    want = _ALGORITHM_OF.get(p.strategy)
    got = p.speculative.algorithm if p.speculative else None
    if want != got:
        raise ProfileError(f"strategy {p.strategy.value} needs speculative.algorithm {want}, got {got}")
    if p.speculative is not None and p.acceptance is None:
        raise ProfileError("a speculative profile needs [acceptance]")
    if (p.ngram is not None) != (got == "NGRAM"):
        raise ProfileError("[ngram] belongs to NGRAM profiles, and every NGRAM profile needs it")
    spec = p.speculative
    if spec is not None and spec.algorithm == "NGRAM" and spec.draft_model_path is not None:
        raise ProfileError("speculative.draft_model_path: NGRAM has no draft model")
    if spec is not None and spec.algorithm != "NGRAM" and not spec.draft_model_path:
        raise ProfileError(f"speculative.draft_model_path: {spec.algorithm} needs its drafter")
    if spec is not None and spec.algorithm == "DDTREE" and spec.ddtree_budget is None:
        raise ProfileError("speculative.ddtree_budget: a DDTree profile needs its budget")
    if p.max_total_num_tokens < p.max_running_requests:
        raise ProfileError("max_total_num_tokens: smaller than max_running_requests (not a token per request)")


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
        raise ProfileError(f"unknown profile {name_or_path!r} (known: {', '.join(profile_names())})")
    try:
        raw = tomllib.loads(path.read_text())
        profile = msgspec.convert(raw, Profile)
        _check_consistent(profile)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError, ProfileError) as e:
        raise ProfileError(f"{path.name}: {e}") from None
    stated = numeric_parameters(raw)
    missing = [k for k in stated if k not in profile.provenance]
    if missing:
        raise ProfileError(f"{path.name}: parameters without provenance: {', '.join(missing)}")
    stray = sorted(set(profile.provenance) - set(stated))
    if stray:
        raise ProfileError(f"{path.name}: provenance for parameters the file does not set: {', '.join(stray)}")
    try:
        profile.provenance_entries()
    except ProvenanceError as e:
        raise ProfileError(f"{path.name}: {e}") from None
    return profile


def list_profiles() -> list[Profile]:
    """All bundled profiles."""
    return [load_profile(n) for n in profile_names()]
