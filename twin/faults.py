"""Fault knobs of one twin server, for the gateway's reliability tests.

- latency: every generation request waits this long before its response starts;
- error rate: that fraction of generation requests gets a 5xx before the first byte (a seeded
  RNG, so a test with a fixed seed sees a fixed pattern);
- crash after N tokens: the process exits abruptly (no clean shutdown, connections drop);
- crash on a prompt: a generation request whose prompt contains the text makes the process exit
  abruptly before it answers (a request that crashes the server it is sent to, a "query of death");
- hang after N tokens: the step loop stops; requests in flight and new ones never progress (/ready
  stays 200, as SGLang's does, until a /health check has timed out);
- slow ready: /ready, /health and generation answer 503 for S seconds after start (server.py);
- acceptance drop: after S seconds, acceptance is multiplied by a fraction (drift for policies).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from twin.errors import ApiError
from twin.options import FaultOptions
from twin.runtime import Runtime

__all__ = ["Faults", "CRASH_EXIT_CODE"]

CRASH_EXIT_CODE = 70


class Faults:
    def __init__(self, options: FaultOptions, runtime: Runtime, seed: int) -> None:
        self.options = options
        self.runtime = runtime
        self._rng = random.Random(seed ^ 0x5EED)
        self._delivered = 0
        self._drop_handle: asyncio.TimerHandle | None = None

    def install(self) -> None:
        """Arm the time- and token-driven faults; call from within the running loop."""
        o = self.options
        if o.crash_after_tokens is not None or o.hang_after_tokens is not None:
            self.runtime.on_tokens.append(self._count)
        if o.accept_drop_at_s is not None:
            self._drop_handle = asyncio.get_running_loop().call_later(o.accept_drop_at_s, self._drop_acceptance)

    def uninstall(self) -> None:
        if self._drop_handle is not None:
            self._drop_handle.cancel()

    def _drop_acceptance(self) -> None:
        self.runtime.engine.accept_scale = self.options.accept_drop_to

    def _count(self, n_tokens: int) -> None:
        self._delivered += n_tokens
        o = self.options
        if o.crash_after_tokens is not None and self._delivered >= o.crash_after_tokens:
            print(f"specroute sim: injected crash after {self._delivered} tokens", file=sys.stderr, flush=True)
            os._exit(CRASH_EXIT_CODE)
        if o.hang_after_tokens is not None and self._delivered >= o.hang_after_tokens:
            self.runtime.hang()

    async def before_generation(self, prompt_text: str = "") -> None:
        """Added latency, then maybe an injected 5xx (before any byte of the response), or a crash
        when the prompt holds `crash_on_prompt`."""
        o = self.options
        if o.crash_on_prompt and o.crash_on_prompt in prompt_text:
            print("specroute sim: injected crash on a prompt", file=sys.stderr, flush=True)
            os._exit(CRASH_EXIT_CODE)
        if o.latency_ms > 0:
            await asyncio.sleep(o.latency_ms / 1000.0)
        if o.error_rate > 0 and self._rng.random() < o.error_rate:
            raise ApiError("Internal server error (injected fault)", status=o.error_status)
