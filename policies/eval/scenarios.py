"""The evaluation scenarios: a backend pool and a sequence of load phases, in virtual seconds.

Every scenario is a closed-loop client population: `concurrency` clients each keep one request
in flight, drawing the prompt domain from the phase's mix. Phases are long enough (tens of
virtual seconds, i.e. tens to thousands of requests) for a learning policy to pay its
exploration and still be judged per phase. `degrade` multiplies one backend's acceptance by
`scale` from `at_s` on (the twin's `accept_scale` fault knob).
"""

from __future__ import annotations

import msgspec

__all__ = ["Degrade", "K26_POOL", "Phase", "QWEN_POOL", "SCENARIOS", "Scenario", "scenario_names"]

K26_POOL: tuple[str, ...] = ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree")
QWEN_POOL: tuple[str, ...] = ("qwen36-ar", "qwen36-ddtree-b15", "qwen36-ddtree-b64")

ALL = {"math": 1.0, "code": 1.0, "chat": 1.0}


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    """A stretch of constant client concurrency and domain mix."""

    name: str
    duration_s: float
    concurrency: int
    domains: dict[str, float]  # domain -> weight


class Degrade(msgspec.Struct, frozen=True, kw_only=True):
    """From `at_s` on, `backend`'s per-draft acceptance probability is multiplied by `scale`."""

    backend: str
    at_s: float
    scale: float


class Scenario(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    pool: tuple[str, ...]  # twin profile names; the backend is named like its profile
    phases: tuple[Phase, ...]
    degrade: Degrade | None = None
    min_tokens: int = 384  # max_tokens per request drawn uniformly in [min_tokens, max_tokens]
    max_tokens: int = 640

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)


def _seconds(c: int) -> float:
    """Phase length: at least ~30 requests at low concurrency, where one request is a large
    share of a phase and a single exploratory choice would otherwise swing the phase's mean."""
    return 120.0 if c <= 2 else 60.0


def _steady(c: int) -> Scenario:
    return Scenario(
        name=f"steady-{c}", description=f"{c} clients, one domain per phase (math, code, chat)",
        pool=K26_POOL,
        phases=tuple(Phase(name=d, duration_s=_seconds(c), concurrency=c, domains={d: 1.0})
                     for d in ("math", "code", "chat")))


def _ramp() -> Scenario:
    levels = (1, 2, 4, 8, 16, 32, 64, 32, 16, 8, 4, 2, 1)
    return Scenario(
        name="ramp", description="concurrency 1 -> 64 -> 1, mixed domains", pool=K26_POOL,
        phases=tuple(Phase(name=f"{i:02d}-c{c}", duration_s=_seconds(c), concurrency=c, domains=ALL)
                     for i, c in enumerate(levels)))


def _mixed() -> Scenario:
    spec = (
        ("math-c4", 4, {"math": 1.0}),
        ("chat-c32", 32, {"chat": 1.0}),
        ("code-math-c16", 16, {"code": 1.0, "math": 1.0}),
        ("chat-c2", 2, {"chat": 1.0}),
        ("all-c64", 64, ALL),
        ("math-c8", 8, {"math": 3.0, "chat": 1.0}),
        ("code-c1", 1, {"code": 1.0}),
        ("chat-code-c24", 24, {"chat": 2.0, "code": 1.0}),
    )
    return Scenario(
        name="mixed", description="domains and concurrency changing by phase", pool=K26_POOL,
        phases=tuple(Phase(name=n, duration_s=_seconds(c), concurrency=c, domains=d) for n, c, d in spec))


def _degrade() -> Scenario:
    return Scenario(
        name="degrade", description="k26-ddtree acceptance x0.7 at t=60 s; 8 clients, mixed domains",
        pool=K26_POOL,
        phases=(Phase(name="before", duration_s=60.0, concurrency=8, domains=ALL),
                Phase(name="after", duration_s=90.0, concurrency=8, domains=ALL)),
        degrade=Degrade(backend="k26-ddtree", at_s=60.0, scale=0.7))


def _qwen() -> Scenario:
    levels = (1, 4, 16, 48, 16, 4, 1)
    return Scenario(
        name="qwen", description="Qwen3.6-27B pool (AR, DDTree budgets 15 and 64), ramp, mixed domains",
        pool=QWEN_POOL,
        phases=tuple(Phase(name=f"{i:02d}-c{c}", duration_s=_seconds(c), concurrency=c, domains=ALL)
                     for i, c in enumerate(levels)))


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (
        *(_steady(c) for c in (1, 4, 16, 32, 64)),
        _ramp(), _mixed(), _degrade(), _qwen(),
    )
}


def scenario_names() -> list[str]:
    return list(SCENARIOS)
