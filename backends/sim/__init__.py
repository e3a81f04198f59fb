"""The twin: an SGLang-compatible simulated server and its clock-agnostic engine.

Pure, importable without starting anything (the policy evaluator drives the engine on a virtual
clock): `Engine`, profiles, the closed-loop virtual driver. The HTTP server lives in
`backends.sim.server` and the CLI (`specroute sim`) in `backends.sim.cli`.
"""

from backends.sim.domain import classify
from backends.sim.engine import (Emission, Engine, EngineStats, QueueFull, SimRequest,
                                 SpecDetails, StepResult)
from backends.sim.profile import Profile, ProfileError, list_profiles, load_profile, profile_names
from backends.sim.virtual import LevelResult, run_closed_loop

__all__ = [
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
    "classify",
    "list_profiles",
    "load_profile",
    "profile_names",
    "run_closed_loop",
]
