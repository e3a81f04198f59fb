"""How many requests per second a server sustains on a phase's traffic: the scale of open-loop loads.

A phase's `load` is a fraction of the *reference capacity*: N servers of the scenario's
`reference` profile, each at its saturation rate for the phase's traffic. That rate is measured,
not computed: one server of the profile alone, `max_running` closed-loop clients running the
phase's sessions back to back without think time (so every client keeps a request in flight and
its conversations keep their prefix on that server), completions per second after a warm-up.
It includes what the traffic costs: prefill of long contexts, reasoning tokens, tool-result
turns, the prefix cache's hits. The figure depends on the traffic and the profile only (a fixed
seed), so every fleet of N servers, and every contestant, faces the same arrival rate.
"""

from __future__ import annotations

import functools

import msgspec

from evaluate.scenarios import Phase, Scenario

__all__ = ["WARMUP_S", "MEASURE_S", "reference_rate", "server_capacity"]

WARMUP_S = 45.0
MEASURE_S = 150.0


@functools.lru_cache(maxsize=256)
def _capacity(member: str, phase_json: bytes, min_tokens: int, max_tokens: int) -> float:
    from evaluate.sim import build_engines, simulate  # the simulator imports this module
    from policies.simple import Pinned

    ph = msgspec.json.decode(phase_json, type=Phase)
    probe = Scenario(
        name=f"capacity:{member}",
        description="",
        pool=(member,),
        phases=(),
        min_tokens=min_tokens,
        max_tokens=max_tokens,
    )
    engine = next(iter(build_engines(probe, 0).values()))
    name = next(iter(build_engines(probe, 0)))
    closed = msgspec.structs.replace(
        ph,
        name="capacity",
        arrival="closed",
        load=0.0,
        duration_s=WARMUP_S + MEASURE_S,
        concurrency=engine.max_running,
        represents_s=0.0,
    )
    probe = msgspec.structs.replace(probe, phases=(closed,))
    run = simulate(probe, lambda e, s: Pinned(name), seed=0, ignore_delays=True)
    done = sum(1 for r in run.records if r.t_last >= WARMUP_S)
    return done / MEASURE_S


def server_capacity(member: str, phase: Phase, min_tokens: int, max_tokens: int) -> float:
    """Saturation requests/s of one `member` server (a fleet member string) on `phase`'s traffic."""
    return _capacity(member, msgspec.json.encode(phase), min_tokens, max_tokens)


def reference_rate(scenario: Scenario, phase: Phase, n_servers: int) -> float:
    """Requests/s that `load = 1.0` means for a fleet of `n_servers`."""
    return n_servers * server_capacity(scenario.reference, phase, scenario.min_tokens, scenario.max_tokens)
