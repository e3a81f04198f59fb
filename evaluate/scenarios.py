"""The evaluation scenarios: a fleet and a sequence of load phases, in virtual seconds.

A phase is either a closed-loop client population (`arrival="closed"`: `concurrency` clients each
keep one session going, the original closed-loop scenarios) or open-loop arrivals (`poisson` or `bursty`,
`evaluate.arrivals`) at `load` x the reference capacity: `load` is a fraction of what a
fleet of the same size of the `reference` profile sustains on the phase's traffic (its saturation
request rate, `evaluate.capacity`), so every fleet of that size faces the same arrivals in
requests per second and 1.1 means more than such a fleet can serve. A phase's `mix` carries the
realism axes (sessions, tools, thinking, temperature, long context; `evaluate.workload`);
without one, every request is a single greedy prompt as in the closed-loop scenarios.

`pool` lists fleet members (`evaluate.fleet`: a profile name, optionally `2x...` and
`:b=`/`:t=`/`:a=` options). `degrade` multiplies one backend's acceptance by `scale` from `at_s`
on (the twin's `accept_scale` fault knob). `max_queued` is SGLang's `--max-queued-requests` on
every server (None: unbounded, SGLang's default): a request finding a full queue gets 503, the
harness retries it once on another backend as the gateway does, then counts it shed.
`represents_s` is how much of a day a phase stands for (the "day" scenario simulates a sample of
each stretch; `plan` weighs phases and prices restarts with it).

A phase with a `source` (`evaluate.sources`) takes its sessions from it instead of its mix: a
recorded trace (`arrival="trace"`: the trace's own arrival times, its window at its speed-up
lasting `duration_s`) or the agentic shape (Poisson or bursty arrivals at `load`, like any mix).
"""

from __future__ import annotations

import msgspec

from evaluate.arrivals import ARRIVALS, BurstShape
from evaluate.sources import AgenticSource, Source, TraceSource
from evaluate.workload import Mix

__all__ = [
    "DAY_MIX",
    "Degrade",
    "K26_POOL",
    "Phase",
    "QWEN_POOL",
    "REALISTIC_MIX",
    "SCENARIOS",
    "Scenario",
    "scenario_names",
]

K26_POOL: tuple[str, ...] = ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree")
QWEN_POOL: tuple[str, ...] = ("qwen36-ar", "qwen36-ddtree-b15", "qwen36-ddtree-b64")

ALL = {"math": 1.0, "code": 1.0, "chat": 1.0}


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    """A stretch of constant client concurrency and domain mix."""

    name: str
    duration_s: float
    concurrency: int = 0  # closed loop: clients
    domains: dict[str, float]  # domain -> weight
    arrival: str = "closed"  # closed | poisson | bursty
    load: float = 0.0  # open loop: fraction of the reference capacity
    mix: Mix | None = None
    burst: BurstShape | None = None
    represents_s: float = 0.0  # wall time of the day this phase stands for (0: its duration)
    source: Source | None = None  # sessions from a trace or the agentic shape instead of the mix

    @property
    def open_loop(self) -> bool:
        return self.arrival != "closed"

    @property
    def span_s(self) -> float:
        return self.represents_s or self.duration_s

    def validate(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"phase {self.name!r}: arrival is one of {', '.join(ARRIVALS)}, not {self.arrival!r}")
        if not self.duration_s > 0:
            raise ValueError(f"phase {self.name!r}: duration_s must be > 0")
        if (self.arrival == "trace") != isinstance(self.source, TraceSource) and self.open_loop:
            raise ValueError(f"phase {self.name!r}: trace arrivals and a trace source go together")
        if self.open_loop and self.arrival != "trace" and not 0 < self.load <= 10:
            raise ValueError(f"phase {self.name!r}: an open-loop phase needs 0 < load <= 10, got {self.load!r}")
        if not self.open_loop and self.concurrency < 1:
            raise ValueError(f"phase {self.name!r}: a closed-loop phase needs concurrency >= 1")
        if not self.domains or any(w < 0 for w in self.domains.values()) or sum(self.domains.values()) <= 0:
            raise ValueError(f"phase {self.name!r}: domains need non-negative weights with a positive total")
        bad = [d for d in self.domains if d not in ("math", "code", "chat")]
        if bad:
            raise ValueError(f"phase {self.name!r}: unknown domain {bad[0]!r} (math, code, chat)")
        try:
            if self.mix is not None:
                self.mix.validate()
            if isinstance(self.source, AgenticSource):
                self.source.shape.validate()
        except ValueError as e:
            raise ValueError(f"phase {self.name!r}: {e}") from None


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
    min_tokens: int = 384  # answer tokens per request drawn uniformly in [min_tokens, max_tokens]
    max_tokens: int = 640
    max_queued: int | None = None  # SGLang --max-queued-requests per server
    reference: str = "k26-dflash"  # open-loop loads are fractions of N servers of this profile
    prompt_tokens: tuple[int, int] = (50, 400)  # a single request's prompt (phases without a mix)
    # The random streams of a phase (its arrivals and sessions) are keyed by the scenario's name
    # and the phase's index; with `streams_by_phase_name`, by the phase's name alone, so that a
    # traffic file draws the same requests under any file name and a phase keeps its requests when
    # others are added, removed or reordered (a file's phase names are unique).
    streams_by_phase_name: bool = False

    def stream_key(self, index: int, first_phase: int = 0) -> str:
        """The key of phase `index`'s random streams; `first_phase`: this scenario's phases start
        at that index of a longer run's (whose streams they draw)."""
        if self.streams_by_phase_name:
            return f"phase:{self.phases[index].name}"
        return f"{self.name}:{index + first_phase}"

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    @property
    def open_loop(self) -> bool:
        return any(p.open_loop for p in self.phases)

    def validate(self) -> None:
        if not self.phases:
            raise ValueError(f"scenario {self.name!r} has no phases")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"scenario {self.name!r}: need 1 <= min_tokens <= max_tokens")
        if self.max_queued is not None and self.max_queued < 0:
            raise ValueError(f"scenario {self.name!r}: max_queued must be >= 0")
        for p in self.phases:
            p.validate()


def _seconds(c: int) -> float:
    """Phase length: at least ~30 requests at low concurrency, where one request is a large
    share of a phase and a single exploratory choice would otherwise swing the phase's mean."""
    return 120.0 if c <= 2 else 60.0


def _steady(c: int) -> Scenario:
    return Scenario(
        name=f"steady-{c}",
        description=f"{c} clients, one domain per phase (math, code, chat)",
        pool=K26_POOL,
        phases=tuple(
            Phase(name=d, duration_s=_seconds(c), concurrency=c, domains={d: 1.0}) for d in ("math", "code", "chat")
        ),
    )


def _ramp() -> Scenario:
    levels = (1, 2, 4, 8, 16, 32, 64, 32, 16, 8, 4, 2, 1)
    return Scenario(
        name="ramp",
        description="concurrency 1 -> 64 -> 1, mixed domains",
        pool=K26_POOL,
        phases=tuple(
            Phase(name=f"{i:02d}-c{c}", duration_s=_seconds(c), concurrency=c, domains=ALL)
            for i, c in enumerate(levels)
        ),
    )


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
        name="mixed",
        description="domains and concurrency changing by phase",
        pool=K26_POOL,
        phases=tuple(Phase(name=n, duration_s=_seconds(c), concurrency=c, domains=d) for n, c, d in spec),
    )


def _degrade() -> Scenario:
    return Scenario(
        name="degrade",
        description="k26-ddtree acceptance x0.7 at t=60 s; 8 clients, mixed domains",
        pool=K26_POOL,
        phases=(
            Phase(name="before", duration_s=60.0, concurrency=8, domains=ALL),
            Phase(name="after", duration_s=90.0, concurrency=8, domains=ALL),
        ),
        degrade=Degrade(backend="k26-ddtree", at_s=60.0, scale=0.7),
    )


def _qwen() -> Scenario:
    levels = (1, 4, 16, 48, 16, 4, 1)
    return Scenario(
        name="qwen",
        description="Qwen3.6-27B pool (AR, DDTree budgets 15 and 64), ramp, mixed domains",
        pool=QWEN_POOL,
        reference="qwen36-ddtree-b15",
        phases=tuple(
            Phase(name=f"{i:02d}-c{c}", duration_s=_seconds(c), concurrency=c, domains=ALL)
            for i, c in enumerate(levels)
        ),
    )


# Traffic with the realistic axes (thinking, tools, sessions, temperature, long context): shares of
# sessions (assumptions: a plausible production mix for a thinking, agentic model; no public K2.6
# traffic breakdown exists). Temperatures: greedy clients,
# K2.6's instant-mode recommendation (0.6) and its thinking-mode recommendation (1.0, model card).
REALISTIC_MIX = Mix(
    chat=0.35, agent=0.2, thinking=0.5, long_context=0.1, temperatures=((0.0, 0.3), (0.6, 0.3), (1.0, 0.4))
)
DAY_MIX = REALISTIC_MIX
OPEN_LOADS = (0.3, 0.6, 0.9, 1.1)
OPEN_PHASE_S = 120.0
# An operator's queue bound (SGLang's default is unbounded): beyond it a server answers 503 and an
# overloaded fleet sheds instead of queueing for minutes.
OPERATOR_MAX_QUEUED = 128


def _open(kind: str) -> Scenario:
    return Scenario(
        name=f"open-{kind}",
        description=f"open loop, {kind} arrivals at 30/60/90/110% of capacity, realistic mix",
        pool=K26_POOL,
        max_queued=OPERATOR_MAX_QUEUED,
        phases=tuple(
            Phase(
                name=f"load-{round(f * 100)}",
                duration_s=OPEN_PHASE_S,
                arrival=kind,
                load=f,
                domains=ALL,
                mix=REALISTIC_MIX,
            )
            for f in OPEN_LOADS
        ),
    )


def _sessions() -> Scenario:
    chat = Mix(chat=0.8, agent=0.2, thinking=0.3, think_s=8.0, turns=(3, 8), temperatures=((0.0, 0.5), (1.0, 0.5)))
    return Scenario(
        name="sessions",
        description="multi-turn chats and agent loops (prefix reuse), Poisson at 40% and 70%",
        pool=K26_POOL,
        max_queued=OPERATOR_MAX_QUEUED,
        phases=(
            Phase(name="load-40", duration_s=180.0, arrival="poisson", load=0.4, domains=ALL, mix=chat),
            Phase(name="load-70", duration_s=180.0, arrival="poisson", load=0.7, domains=ALL, mix=chat),
        ),
    )


def _day() -> Scenario:
    """A day in eight stretches: load swings from a quiet night to two peaks, the domain mix
    shifts (code by day, chat in the evening) and the night is agentic batch work with long
    contexts. Each stretch is simulated for 120 s of steady traffic (`represents_s` is its real
    length): enough for thousands of requests, and what `plan` weighs a stretch by."""
    hour = 3600.0
    spec: tuple[tuple[str, int, float, dict[str, float], dict[str, float]], ...] = (  # name, hours, load, domains, mix
        ("00-night", 6, 0.15, {"math": 1.0, "code": 2.0, "chat": 1.0}, dict(agent=0.45, chat=0.15, long_context=0.25)),
        ("06-morning", 3, 0.45, {"math": 1.0, "code": 2.0, "chat": 2.0}, {}),
        ("09-peak", 3, 0.85, {"math": 1.0, "code": 3.0, "chat": 2.0}, {}),
        ("12-lunch", 2, 0.6, {"math": 1.0, "code": 1.0, "chat": 2.0}, dict(chat=0.45, agent=0.1)),
        ("14-peak", 3, 0.9, {"math": 1.0, "code": 3.0, "chat": 2.0}, {}),
        ("17-evening", 3, 0.55, {"math": 1.0, "code": 1.0, "chat": 3.0}, dict(chat=0.5, agent=0.1)),
        ("20-late", 2, 0.35, {"math": 2.0, "code": 1.0, "chat": 3.0}, dict(thinking=0.7)),
        ("22-night", 2, 0.2, {"math": 1.0, "code": 2.0, "chat": 1.0}, dict(agent=0.4, long_context=0.2)),
    )
    return Scenario(
        name="day",
        description="a day: load 15-90% of capacity, domain/session/thinking/tool mix changing",
        pool=K26_POOL,
        max_queued=OPERATOR_MAX_QUEUED,
        phases=tuple(
            Phase(
                name=n,
                duration_s=120.0,
                arrival="poisson",
                load=load,
                domains=d,
                mix=msgspec.structs.replace(DAY_MIX, **changes),
                represents_s=h * hour,
            )
            for n, h, load, d, changes in spec
        ),
    )


AGENTIC_PHASE_S = 300.0  # an agent loop of ~8 calls with 70K-token prompts runs for minutes


def _agentic() -> Scenario:
    """Coding-agent loops of the shape derived from GitHub Copilot's agent traces
    (`loadgen.agentic`: ~68K-token prompts, mostly cached, ~0.5K-token outputs, tool calls between
    calls, 15% copy-heavy edits), with K2.6's settings (70% thinking at T=1.0, the rest at 0.6)."""
    return Scenario(
        name="agentic",
        description="coding-agent loops (Copilot's shape: long cached prompts, short outputs, tool calls, "
        "copy-heavy edits), Poisson at 50% and 90%",
        pool=K26_POOL,
        max_queued=OPERATOR_MAX_QUEUED,
        phases=tuple(
            Phase(
                name=f"load-{round(f * 100)}",
                duration_s=AGENTIC_PHASE_S,
                arrival="poisson",
                load=f,
                domains={"code": 1.0},
                source=AgenticSource(),
            )
            for f in (0.5, 0.9)
        ),
    )


def _offprior() -> Scenario:
    """Twins whose physics are not the studies' figures the policy's priors come from: a slower
    DFlash machine, a weaker DDTree drafter, a faster EAGLE-3 machine. Cold start counts."""
    return Scenario(
        name="offprior",
        description="physics off the priors (dflash t=1.4, ddtree a=0.8, eagle3 t=0.8), Poisson 60%",
        pool=("k26-ar", "k26-eagle3:t=0.8", "k26-dflash:t=1.4", "k26-ddtree:a=0.8"),
        max_queued=OPERATOR_MAX_QUEUED,
        phases=(Phase(name="load-60", duration_s=180.0, arrival="poisson", load=0.6, domains=ALL, mix=REALISTIC_MIX),),
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        *(_steady(c) for c in (1, 4, 16, 32, 64)),
        _ramp(),
        _mixed(),
        _degrade(),
        _qwen(),
        _open("poisson"),
        _open("bursty"),
        _sessions(),
        _day(),
        _offprior(),
        _agentic(),
    )
}
for _s in SCENARIOS.values():
    _s.validate()


def scenario_names() -> list[str]:
    return list(SCENARIOS)
