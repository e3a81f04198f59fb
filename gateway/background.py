"""Background Responses (`background: true`) held in admission until they are done.

SGLang answers such a request at once, `queued`, and generates it afterwards on the same server
(`serving_responses.py: _run_background_request`): the answer's lease ends long before the GPU's
work does. So the gateway takes a lease on that backend for the Response, as admission counts any
request in flight (`admission.max_inflight`, the backend's cap), and gives it back once the
Response's status is final (completed, failed, cancelled, incomplete), which it reads with a GET
every `poll_s`, for at most `max_s` (`timeouts.request_s`: what a foreground request may take).
A Response the backend no longer knows (restarted) or a backend that does not answer ends the hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from gateway.admission import Admission
from gateway.attempt import NET_ERRORS
from gateway.pool import Backend
from gateway.response_holders import response_segments
from gateway.via import VIA_ENTRY

__all__ = ["BackgroundHolds"]

log = logging.getLogger("specroute.background")
_decoder = msgspec.json.Decoder()
RUNNING = frozenset({"queued", "in_progress"})


class BackgroundHolds:
    def __init__(self, admission: Admission, *, poll_s: float = 1.0, max_s: float = 900.0) -> None:
        self.admission = admission
        self.poll_s = poll_s
        self.max_s = max_s
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def hold(self, backend: Backend, response_id: str, sequences: int = 1) -> None:
        lease = self.admission.lease(backend, sequences)
        task = asyncio.get_running_loop().create_task(self._watch(backend, response_id, lease.release))
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, backend: Backend, response_id: str, release: Callable[[], None]) -> None:
        deadline = time.monotonic() + self.max_s
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(self.poll_s)
                try:
                    status, body = await backend.client.call(
                        "GET", response_segments(response_id), 5.0, {"Via": VIA_ENTRY}, 1 << 20
                    )
                except NET_ERRORS:
                    return  # unreachable, or an answer too large to be a running Response
                if status != 200:
                    return  # not stored there any more (restarted): nothing left to hold
                try:
                    answer = _decoder.decode(body)
                except JSON_DECODE_ERRORS:
                    return
                if not isinstance(answer, dict) or answer.get("status") not in RUNNING:
                    return
            log.warning(
                "background Response %s on %s still running after %gs: no longer counted",
                response_id,
                backend.name,
                self.max_s,
            )
        finally:
            release()

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
