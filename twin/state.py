"""Server-wide state shared by the twin's routes: options, resolved profile, runtime, readiness."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from typing import Any

from aiohttp import web

from twin.engine import Engine
from twin.faults import Faults
from twin.lora import LoraRegistry
from twin.metrics import Metrics
from twin.options import ServerOptions
from twin.profile import Profile
from twin.runtime import Runtime

__all__ = ["RESPONSE_STORE_LIMIT", "ResponseStore", "SimState", "STATE_KEY", "new_rid"]

SGLANG_VERSION = "0.5.23"
# assumption: SGLang's store has no limit (`--enable-response-store`: "Storage has no TTL or size
# limit"); the twin keeps the newest 10,000 responses, so a long run cannot exhaust its memory
RESPONSE_STORE_LIMIT = 10_000


class ResponseStore:
    """`--enable-response-store`: `serving_responses.py`'s `response_store` (id -> the response
    object) and `msg_store` (id -> the conversation so far: input items, then output items) as one
    entry per id, plus the `background_tasks` in flight. Bounded, oldest out first (assumption)."""

    def __init__(self, limit: int = RESPONSE_STORE_LIMIT) -> None:
        self.limit = limit
        # id -> [response or None (conversation stored, response not yet), conversation]
        self._entries: OrderedDict[str, list[Any]] = OrderedDict()
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, rid: str) -> dict[str, Any] | None:
        entry = self._entries.get(rid)
        return entry[0] if entry is not None else None

    def messages(self, rid: str) -> list[Any]:
        entry = self._entries.get(rid)
        return list(entry[1]) if entry is not None else []

    def put(self, rid: str, response: dict[str, Any] | None, messages: list[Any] | None = None) -> None:
        """Store or replace a response (None: keep the current one) and its conversation (None:
        keep); beyond the limit the oldest entry goes."""
        entry = self._entries.setdefault(rid, [None, []])
        if response is not None:
            entry[0] = response
        if messages is not None:
            entry[1] = messages
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)


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
        self.responses = ResponseStore()  # used only with --enable-response-store

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
