"""The twin: an SGLang-compatible simulated server and its clock-agnostic engine.

Pure, importable without starting anything (the policy evaluator drives the engine on a virtual
clock): `Engine`, profiles, the closed-loop virtual driver. The HTTP server lives in
`backends.sim.server` and the CLI (`specroute sim`) in `backends.sim.cli`.
"""

from backends.sim.domain import classify, prompt_key
from backends.sim.engine import Emission, Engine, EngineStats, QueueFull, SimRequest, SpecDetails, StepResult
from backends.sim.prefix_cache import PREFIX_BLOCK_TOKENS, chain_from_text, chain_from_tokens
from backends.sim.profile import Profile, ProfileError, list_profiles, load_profile, profile_names
from backends.sim.thinking import reasoning_tokens
from backends.sim.virtual import LevelResult, run_closed_loop

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
