"""The twin: an SGLang-compatible simulated server and its clock-agnostic engine.

Pure, importable without starting anything (the policy evaluator drives the engine on a virtual
clock): `Engine`, profiles, the closed-loop virtual driver. The HTTP server lives in
`twin.server` and the CLI (`specroute sim`) in `twin.cli`.
"""

from twin.domain import classify, prompt_key
from twin.engine import Emission, Engine, EngineStats, QueueFull, SimRequest, SpecDetails, StepResult
from twin.prefix_cache import PREFIX_BLOCK_TOKENS, chain_from_text, chain_from_tokens
from twin.profile import Profile, ProfileError, list_profiles, load_profile, profile_names
from twin.thinking import reasoning_tokens
from twin.virtual import LevelResult, run_closed_loop

__all__ = [
    "PREFIX_BLOCK_TOKENS",
    "Emission",
    "Engine",
    "EngineStats",
    "LevelResult",
    "Profile",
    "ProfileError",
    "QueueFull",
    "SimRequest",
    "SpecDetails",
    "StepResult",
    "chain_from_text",
    "chain_from_tokens",
    "classify",
    "list_profiles",
    "load_profile",
    "profile_names",
    "prompt_key",
    "reasoning_tokens",
    "run_closed_loop",
]
