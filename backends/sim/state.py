"""Server-wide state shared by the twin's routes: options, resolved profile, runtime, readiness."""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from backends.sim.engine import Engine
from backends.sim.faults import Faults
from backends.sim.lora import LoraRegistry
from backends.sim.metrics import Metrics
from backends.sim.options import ServerOptions
from backends.sim.profile import Profile
from backends.sim.runtime import Runtime

__all__ = ["SimState", "STATE_KEY", "new_rid"]

SGLANG_VERSION = "0.5.23"


class SimState:
    """What every handler needs; stored on the app under STATE_KEY."""

    def __init__(self, profile: Profile, options: ServerOptions, runtime: Runtime) -> None:
        self.profile = profile
        self.options = options
        self.runtime = runtime
        self.served_model_name = options.served_model_name or profile.served_model_name
        self.version = options.compat or SGLANG_VERSION
        self.legacy = options.compat is not None
        self.ready = False  # started and not shutting down
        # SGLang's ServerStatus Up (True) or UnHealthy: a /health check that saw no output for its
        # whole timeout sets it False, and /ready then answers 503 too, until a check passes.
        self.healthy = True
        self.created = int(time.time())
        self.rng_seed = options.seed
        self.faults = Faults(options.faults, runtime, options.seed)
        self.metrics = Metrics(self.served_model_name) if options.enable_metrics else None
        self.lora = LoraRegistry(options.lora)  # loaded adapters (lora.py); empty unless --enable-lora

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    @property
    def max_running_requests(self) -> int:
        return self.runtime.engine.max_running


STATE_KEY: web.AppKey[SimState] = web.AppKey("sim_state", SimState)


def new_rid() -> str:
    """SGLang's request id: 32 hex characters, no prefix."""
    return uuid.uuid4().hex
