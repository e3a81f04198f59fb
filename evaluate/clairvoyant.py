"""The per-request clairvoyant: every request to the backend where it finishes soonest, by the truth.

It reads what no gateway can: each engine's live queue and batch, its KV in use, its prefix cache
(how much of this prompt it would serve from cache), and this request's own acceptance (domain,
prompt, temperature, context length, fault scale) and its true output length. Its cost of a
choice is goodput's cost model evaluated with those truths:

    e2e = queue wait + prefill of the uncached part + (tokens - 1) / decode rate at the new load

with the decode rate = expected tokens per verify pass (1 + sum_{j<=m} p^j for the engine's
truncated geometric law) / step time at the batch and KV it would join, and the queue wait, when
the backend is full, the time for the slots ahead to free (the waiting requests' share of the
running batch's remaining work), plus what the choice costs the requests already running there:
each step they share grows by the new sequence's verify work and KV reads, for as many steps as
they overlap (a long context on a fast server slows every request on it; greedy e2e alone would
pile long contexts onto the fastest server). It is greedy (it does not plan for requests yet to
come), so it is a reference for what per-request routing with perfect information does, not a
bound. The
`clairvoyant/<objective>` contestants (goodput's decision rule with true acceptance and step time
per domain, `evaluate.oracle`) stay the reference for the closed-loop scenarios.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from evaluate.workload import Turn
from policies.base import BackendView, Decision, NoCandidate, Outcome, RequestFeatures
from twin.domain import prompt_key
from twin.engine import Engine, SimRequest
from twin.prefix_cache import PREFIX_BLOCK_TOKENS

__all__ = ["Clairvoyant", "expected_accept"]


def expected_accept(p: float, max_drafts: int) -> float:
    """Tokens per verify pass (accepted drafts + the bonus token) under P(a >= j) = p^j, a <= m."""
    if max_drafts <= 0:
        return 1.0
    p = min(max(p, 0.0), 0.999)
    return 1.0 + p * (1.0 - p**max_drafts) / (1.0 - p)


class Clairvoyant:
    name = "clairvoyant/e2e"

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines = engines
        self._running: Callable[[str], Iterable[SimRequest]] = lambda name: ()

    def bind_inflight(self, running: Callable[[str], Iterable[SimRequest]]) -> None:
        """The simulator hands over each backend's requests in flight (their true progress)."""
        self._running = running

    def observe(self, outcome: Outcome) -> None:
        pass

    def cost(self, name: str, turn: Turn) -> float:
        """Own predicted e2e plus the delay the choice adds to the requests running on `name`."""
        engine = self.engines[name]
        cap = engine.max_running
        ahead = engine.num_running + engine.num_waiting
        batch = min(ahead + 1, cap)
        kv_now = engine.stats().num_used_tokens
        kv = kv_now + turn.prompt_tokens + turn.max_tokens // 2
        step = engine.step_time(batch, kv_tokens=kv)
        p = (
            engine.accept_prob(
                turn.domain, prompt_key(turn.tag), temperature=turn.temperature, context_tokens=turn.prompt_tokens
            )
            * engine.accept_scale
        )
        accept = expected_accept(p, engine.profile.max_accept_drafts)
        rate = accept / step
        cached = min(engine.cache.match(turn.chain) * PREFIX_BLOCK_TOKENS, turn.prompt_tokens - 1)
        prefill = engine.prefill_time(turn.prompt_tokens - cached, batch - 1, cached)
        wait = 0.0
        if ahead + 1 > cap:  # the queue ahead drains at cap requests per mean request time
            wait = (ahead + 1 - cap) / cap * (turn.max_tokens / rate)
        own_steps = turn.max_tokens / accept
        extra = step - engine.step_time(max(batch - 1, 1), kv_tokens=kv_now) if ahead else 0.0
        harm = 0.0
        if extra > 0:
            for r in self._running(name):
                left = r.limit - r.completion_tokens
                harm += extra * min(left / max(r.accept_length, 1.0), own_steps)
        return wait + prefill + (turn.max_tokens - 1) / rate + harm

    def choose_turn(self, request: RequestFeatures, candidates: Sequence[BackendView], turn: Turn) -> Decision:
        best: tuple[float, BackendView] | None = None
        for v in candidates:
            if not v.healthy:
                continue
            e2e = self.cost(v.spec.name, turn)
            if best is None or e2e < best[0]:
                best = (e2e, v)
        if best is None:
            raise NoCandidate("no healthy backend")
        return Decision(backend=best[1], reason=f"clairvoyant cost {best[0]:.2f} s", score=best[0])

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        raise NotImplementedError("the clairvoyant needs the turn itself: the simulator calls choose_turn")
