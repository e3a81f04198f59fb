"""`specroute plan`: which N servers to run for a traffic, and whether to reshape them over the day.

1. Every composition of N servers over the candidate types (profiles, DDTree budgets) is ranked
   by the fluid model (`evaluate.fluid`): span-weighted mean request tok/s of an ideal
   domain-blind split, per phase at the phase's arrival rate; fleets whose capacity carries every
   phase about as fully as the fleet that carries most first (past a speculative server's cap of
   48 running requests its queue grows without bound, however fast the requests it serves).
2. The best `shortlist` mixed fleets and the best `homogeneous` homogeneous fleets by that ranking,
   the homogeneous fleet with the most capacity for the traffic,
   and the best homogeneous fleet with one server swapped for each other type (what the fluid
   model's domain-blind split cannot value: a server that takes the long contexts or the peak's
   overflow), are simulated on the virtual clock (`evaluate.sim`) over a `sample_s` sample of
   each phase (a bursty one `BURST_CYCLES` burst cycles at least) on `seeds` seeds, every fleet
   drawing the same arrivals on a seed, their figures averaged; each with its best policy:
   goodput (latency and throughput objectives) for mixed fleets; goodput and SGLang's router's
   cache_aware (`evaluate.peers`) for homogeneous ones, since a user's real alternative is a
   homogeneous fleet behind SGLang's router.
3. Each fleet takes the policy with the best score among those whose worst phase meets the SLO
   within `SLO_PARITY` of its best policy's, and fleets whose worst phase falls more than that below
   the most reliable homogeneous fleet's are ranked after those that do not. Fleets are ranked by the
   simulated score: span-weighted over phases of the mean request
   tok/s, where a request that missed the SLO (shed, unfinished, or its first token later than
   the SLO's TTFT) counts 0: speed from starving some requests in a queue, or from shedding them,
   is not speed; with `objective="goodput"`, of the requests/s that met the SLO.
   The margin is over the best homogeneous fleet with its best policy. Fleets whose paired
   per-seed gap to the winner is within the seeds' noise (`within_noise`) are marked as ties, and
   the best homogeneous fleet, when it is one of them, ranks first: a mix has to beat it by more
   than the seeds' noise to be worth running two kinds of server.
4. Reshape: for each phase, the composition the fluid model ranks best *for that phase alone* is
   simulated on it, and so is the winner, both on the requests the phase gets in the whole
   traffic's run; where it beats the day's winner, the schedule switches. The switches cost
   what restarting servers costs: each server whose type changes is down for `restart_s` (rolling,
   one at a time), and the fleet serves that phase one server short meanwhile (fluid model). The
   day wraps around (the last phase is followed by the first).
5. A mixed winner's margin over the best homogeneous fleet is simulated again on `CONFIRM_SEEDS`
   fresh seeds (`FreshSeeds`): a margin that changes sign between seeds is a tie.

`exhaustive=True` simulates every composition instead (the check that the short list finds the
best: within 3%, the target).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence

import msgspec

from evaluate.arrivals import BurstShape
from evaluate.fleet import FleetError, Member, fleet_label, parse_member
from evaluate.fluid import PhaseGrid, fleet_value, type_curve
from evaluate.metrics import PhaseMetrics, phase_metrics
from evaluate.processes import map_in_processes
from evaluate.runner import contestants
from evaluate.scenarios import Phase, Scenario
from evaluate.sim import fleet_servers, simulate
from evaluate.slo import DEFAULT_SLO, SLO
from evaluate.traffic import Traffic

__all__ = [
    "DEFAULT_TYPES",
    "RESTART_S",
    "FleetFigures",
    "FreshSeeds",
    "PlanResult",
    "Reshape",
    "compositions",
    "plan",
    "within_noise",
]

# The K2.6 family: AR, EAGLE-3, DFlash and DDTree at three budgets (32 is the profile's own).
DEFAULT_TYPES: tuple[str, ...] = (
    "k26-ar",
    "k26-eagle3",
    "k26-dflash",
    "k26-ddtree:b=8",
    "k26-ddtree:b=16",
    "k26-ddtree",
)
# Restart of a 1T-parameter server (assumption): ~600 GB of INT4 weights read at ~1.5 GB/s
# (~7 min), then the drafter, CUDA-graph capture and warm-up (~8 min).
RESTART_S = 15 * 60.0
MAX_SERVERS = 16
SLO_PARITY = 0.03  # SLO attainment (share of requests) a faster policy or fleet may give up
RESHAPE_HINT = 0.03  # a phase's own best fleet is simulated when the fluid model puts it this far ahead
# A bursty phase's sample spans at least this many burst cycles: 90 s of the default shape (60 s
# cycles) holds 0.5x to 1.5x the phase's rate from one draw to the next, which decided the ranking.
BURST_CYCLES = 5
MIXED_POLICIES = ("goodput/latency", "goodput/throughput")
# On a homogeneous fleet the SGLang router's best policy in every evaluation run was cache_aware
# (prefix affinity), and goodput's latency objective the best of specroute's; the evaluation runs
# all of them (`specroute eval --fleet homogeneous`).
HOMOGENEOUS_POLICIES = ("goodput/latency", "sglang/cache_aware")
# Seeds every short-listed fleet is simulated on, its score their mean: one seed's sample of a
# phase (a session mix, a burst or none) moves a fleet's score by more than the gaps between the
# best K2.6 fleets, and every fleet draws the same arrivals on a seed (common random numbers).
SEEDS = 3
TIE_FLOOR = 0.005  # score gaps below this share are ties whatever the seeds say


class PhaseFigures(msgspec.Struct, kw_only=True):
    score: float  # the objective's figure for this phase
    request_tok_s: float  # mean over completed requests
    slo_attainment: float
    goodput_rps: float
    ttft_p99_ms: float
    e2e_p99_s: float
    shed: int
    arrived: int


class FleetFigures(msgspec.Struct, kw_only=True):
    fleet: str
    policy: str
    score: float  # span-weighted over phases, the mean over the plan's seeds
    fluid: float  # the fluid model's figure (mean request tok/s of an ideal split)
    homogeneous: bool
    phases: dict[str, PhaseFigures] = {}
    margin: float = 0.0  # score / the best homogeneous fleet's score - 1
    policies_tried: dict[str, float] = {}  # policy -> score
    seed_scores: list[float] = []  # its score on each of the plan's seeds (same arrivals for every fleet)
    # its worst phase's SLO attainment is within SLO_PARITY of the most reliable homogeneous fleet's
    slo_parity: bool = True
    tie: bool = False  # within the seeds' noise of the winner's score (or the winner itself)

    @property
    def worst_slo(self) -> float:
        return min((p.slo_attainment for p in self.phases.values()), default=0.0)


class Switch(msgspec.Struct, kw_only=True):
    before: str  # phase
    after: str
    fleet: str
    servers_restarted: int
    downtime_s: float
    cost: float  # score-seconds lost


class Reshape(msgspec.Struct, kw_only=True):
    schedule: dict[str, str]  # phase -> fleet
    static_score: float
    reshape_score: float  # net of restart costs
    gain: float  # reshape_score / static_score - 1
    switches: list[Switch]
    restart_s: float
    advice: str


class PlanResult(msgspec.Struct, kw_only=True):
    servers: int
    seed: int
    seeds: list[int]  # the seeds every simulated fleet's score is a mean over
    traffic: str
    objective: str
    slo: SLO
    types: list[str]
    rates_rps: dict[str, float]  # phase -> requests/s
    spans_s: dict[str, float]
    ranked: list[FleetFigures]
    best_homogeneous: FleetFigures
    reshape: Reshape | None
    compositions: int
    simulated: int
    sample_s: float
    assumptions: list[str]
    wall_s: float = 0.0
    exhaustive_best: FleetFigures | None = None
    exhaustive: Exhaustive | None = None
    fresh: FreshSeeds | None = None  # the winner's margin again, on seeds it was not chosen on


class FreshSeeds(msgspec.Struct, kw_only=True):
    """The winner and the best homogeneous fleet, each with the policy it was ranked with,
    simulated again on seeds neither was chosen on: one seed's sample of a phase is noisy (a
    session mix, a burst or none), and a margin that changes sign from seed to seed is a tie."""

    seeds: list[int]
    margins: list[float]  # winner / best homogeneous - 1, per seed

    @property
    def tie(self) -> bool:
        return min(self.margins, default=0.0) <= 0.0


class Exhaustive(msgspec.Struct, kw_only=True):
    """The plan's pick against exhaustive search, re-simulated on fresh seeds: the best of many
    noisy scores is biased upwards (the winner's curse), so the exhaustive search's leaders and
    the pick are compared on seeds none of them was selected on."""

    seeds: list[int]
    pick: str
    pick_score: float  # mean over the fresh seeds
    best: str
    best_score: float
    gap: float  # pick / best - 1
    leaders: dict[str, float]  # fleet -> mean score over the fresh seeds
    scores: dict[str, float]  # every composition meeting the SLO parity: its mean score over the plan's seeds


class _Task(msgspec.Struct, frozen=True):
    """One simulation: a fleet (pool strings) under one policy on some phases at given rates."""

    scenario: Scenario
    rates: tuple[float, ...]
    policy: str
    seed: int
    slo: SLO
    first_phase: int = 0  # the scenario's phases start at this index of the traffic's


def _run(task: _Task) -> list[PhaseMetrics]:
    names = [s.name for s in fleet_servers(task.scenario)]
    _, factory = contestants(names, ("latency", "throughput"), task.seed, statics={}, slo=task.slo)[task.policy]
    run = simulate(task.scenario, factory, seed=task.seed, phase_rates=list(task.rates), first_phase=task.first_phase)
    return phase_metrics(run, task.scenario, names, slo=task.slo)


def compositions(n_types: int, n: int) -> list[tuple[int, ...]]:
    """Every way to put n servers on n_types types (counts per type)."""
    out = []
    for cut in itertools.combinations(range(n + n_types - 1), n_types - 1):
        prev = -1
        counts = []
        for c in (*cut, n + n_types - 1):
            counts.append(c - prev - 1)
            prev = c
        out.append(tuple(counts))
    return out


def _members(types: Sequence[Member], counts: Sequence[int]) -> tuple[Member, ...]:
    return tuple(msgspec.structs.replace(t, count=k) for t, k in zip(types, counts, strict=False) if k)


def _label(types: Sequence[Member], counts: Sequence[int]) -> str:
    return fleet_label(_members(types, counts))


def sample_length(phase: Phase, sample_s: float) -> float:
    """Simulated seconds of `phase`: `sample_s`, and for bursty arrivals `BURST_CYCLES` cycles at least;
    a trace's phase is its window (at its speed-up), whatever `sample_s`."""
    if phase.arrival == "trace":
        return phase.duration_s
    if phase.arrival != "bursty":
        return sample_s
    return max(sample_s, BURST_CYCLES * (phase.burst or BurstShape()).cycle_s)


def _phase_score(m: PhaseMetrics, objective: str) -> float:
    return m.goodput_rps if objective == "goodput" else m.slo_request_tok_s


def _mean_phase(runs: Sequence[PhaseMetrics], objective: str) -> PhaseFigures:
    """One phase's figures as their means over seeds (tails included: a mean of p99s)."""
    k = len(runs)
    return PhaseFigures(
        score=sum(_phase_score(m, objective) for m in runs) / k,
        request_tok_s=sum(m.mean_request_tok_s for m in runs) / k,
        slo_attainment=sum(m.slo_attainment for m in runs) / k,
        goodput_rps=sum(m.goodput_rps for m in runs) / k,
        ttft_p99_ms=sum(m.p99_ttft_ms for m in runs) / k,
        e2e_p99_s=sum(m.p99_e2e_s for m in runs) / k,
        shed=round(sum(m.shed for m in runs) / k),
        arrived=round(sum(m.arrived for m in runs) / k),
    )


class _Planner:
    def __init__(
        self,
        n: int,
        traffic: Traffic,
        *,
        slo: SLO,
        types: Sequence[str],
        objective: str,
        sample_s: float,
        seed: int,
        log: Callable[[str], None],
        jobs: int = 1,
        seeds: int = 1,
    ) -> None:
        if not 1 <= n <= MAX_SERVERS:
            raise FleetError(f"--servers must be between 1 and {MAX_SERVERS}, got {n}")
        if objective not in ("tok_s", "goodput"):
            raise ValueError(f"objective is tok_s or goodput, not {objective!r}")
        if not types:
            raise FleetError("no server types to plan over")
        if seeds < 1:
            raise ValueError(f"seeds is at least 1, not {seeds}")
        self.types = [parse_member(t) for t in types]
        if any(t.count != 1 for t in self.types):
            raise FleetError("plan's server types take no count (the planner chooses counts)")
        labels = [t.label for t in self.types]
        if len(set(labels)) != len(labels):
            raise FleetError(f"a server type is listed twice: {labels}")
        self.n = n
        self.traffic = traffic
        self.slo = slo
        self.objective = objective
        self.seed = seed
        self.seeds = [seed + k for k in range(seeds)]
        self.log = log
        base = traffic.scenario
        self.phases = [msgspec.structs.replace(p, duration_s=sample_length(p, sample_s)) for p in base.phases]
        self.base = msgspec.structs.replace(base, phases=tuple(self.phases), degrade=None)
        self.rates = [traffic.rate_of(i, n) for i in range(len(self.phases))]
        self.spans = [p.span_s for p in self.phases]
        self.simulated = 0
        self.jobs = jobs

    # ------------------------------------------------------------------ fluid
    def grids(self) -> list[PhaseGrid]:
        return [
            PhaseGrid([type_curve(t, self.base, ph) for t in self.types], self.rates[i])
            for i, ph in enumerate(self.phases)
        ]

    def weighted(self, values: Sequence[float], spans: Sequence[float] | None = None) -> float:
        spans = self.spans if spans is None else spans
        return sum(v * s for v, s in zip(values, spans, strict=False)) / sum(spans)

    # --------------------------------------------------------------- simulate
    def task(
        self, counts: Sequence[int], policy: str, phase_index: int | None = None, seed: int | None = None
    ) -> _Task:
        """The whole traffic on fleet `counts` under `policy`, or phase `phase_index` alone, with
        the requests it gets in the whole traffic's run; on the plan's seed unless given another."""
        members = _members(self.types, counts)
        pool = tuple(m.label if m.count == 1 else f"{m.count}x{m.label}" for m in members)
        scenario = msgspec.structs.replace(self.base, pool=pool)
        rates = self.rates
        if phase_index is not None:
            scenario = msgspec.structs.replace(scenario, phases=(self.phases[phase_index],))
            rates = [self.rates[phase_index]]
        return _Task(
            scenario=scenario,
            rates=tuple(rates),
            policy=policy,
            seed=self.seed if seed is None else seed,
            slo=self.slo,
            first_phase=phase_index or 0,
        )

    def scores_on(self, fleets: Sequence[tuple[tuple[int, ...], str]], seed: int) -> list[float]:
        """The score of each (fleet, policy) on another seed."""
        tasks = [self.task(c, pol, seed=seed) for c, pol in fleets]
        return [self.weighted([_phase_score(m, self.objective) for m in ms]) for ms in self.run_all(tasks)]

    def run_all(self, tasks: Sequence[_Task]) -> list[list[PhaseMetrics]]:
        self.simulated += len(tasks)
        return map_in_processes(_run, tasks, self.jobs)

    def figures_all(
        self, fleets: Sequence[tuple[tuple[int, ...], float]], seeds: Sequence[int] | None = None
    ) -> dict[tuple[int, ...], FleetFigures]:
        """Simulate each fleet under each of its candidate policies (in parallel) on each of
        `seeds` (the plan's unless given) and keep the best policy; a figure is its mean over the
        seeds, every fleet drawing the same arrivals and sessions on a seed (common random numbers)."""
        seeds = self.seeds if seeds is None else list(seeds)
        jobs: list[tuple[tuple[int, ...], str, int]] = []
        for counts, _ in fleets:
            homogeneous = sum(1 for k in counts if k) == 1
            for pol in HOMOGENEOUS_POLICIES if homogeneous else MIXED_POLICIES:
                jobs += [(counts, pol, sd) for sd in seeds]
        results = self.run_all([self.task(c, pol, seed=sd) for c, pol, sd in jobs])
        runs: dict[tuple[int, ...], dict[str, list[list[PhaseMetrics]]]] = {}
        for (counts, pol, _), ms in zip(jobs, results, strict=True):
            runs.setdefault(counts, {}).setdefault(pol, []).append(ms)
        tried: dict[tuple[int, ...], dict[str, tuple[float, list[PhaseFigures], list[float]]]] = {}
        for counts, by_policy in runs.items():
            for pol, per_seed in by_policy.items():
                scores = [self.weighted([_phase_score(m, self.objective) for m in ms]) for ms in per_seed]
                phases = [_mean_phase([ms[i] for ms in per_seed], self.objective) for i in range(len(self.phases))]
                tried.setdefault(counts, {})[pol] = (sum(scores) / len(scores), phases, scores)
        out = {}
        for counts, fluid in fleets:
            # the best score among the policies whose worst phase meets the SLO about as often as
            # the fleet's best policy at that (a faster average bought with starved requests loses)
            worst = {pol: min(ph.slo_attainment for ph in phs) for pol, (_, phs, _) in tried[counts].items()}
            fair = {pol: v for pol, v in tried[counts].items() if worst[pol] >= max(worst.values()) - SLO_PARITY}
            policy, (score, phases, scores) = max(fair.items(), key=lambda kv: kv[1][0])
            label = _label(self.types, counts)
            self.log(
                f"  simulated {label}: best {policy} {score:.2f} "
                f"({', '.join(f'{p} {s:.1f}' for p, (s, _, _) in tried[counts].items())})"
            )
            out[counts] = FleetFigures(
                fleet=label,
                policy=policy,
                score=score,
                seed_scores=[round(x, 3) for x in scores],
                fluid=fluid,
                homogeneous=sum(1 for k in counts if k) == 1,
                policies_tried={p: round(s, 3) for p, (s, _, _) in tried[counts].items()},
                phases={ph.name: f for ph, f in zip(self.phases, phases, strict=True)},
            )
        return out

    # ---------------------------------------------------------------- reshape
    def reshape(
        self,
        winner_counts: Sequence[int],
        winner: FleetFigures,
        fluid: dict[tuple[int, ...], list[float]],
        restart_s: float,
    ) -> Reshape:
        winner_counts = tuple(winner_counts)
        best_of = [
            max(fluid, key=lambda c, i=i: fluid[c][i])  # type: ignore[misc]  # mypy cannot infer a lambda default's type
            for i in range(len(self.phases))
        ]
        # like for like: both fleets on the phase alone (cold caches and estimates for both)
        jobs: list[tuple[int, tuple[int, ...], str]] = []
        for i, best in enumerate(best_of):
            # worth a simulation only where the fluid model sees a clear gain for the phase
            if best == winner_counts or fluid[best][i] < (1 + RESHAPE_HINT) * fluid[winner_counts][i]:
                best_of[i] = winner_counts
                continue
            jobs.append((i, winner_counts, winner.policy))
            policies = ("goodput/latency", "sglang/cache_aware") if sum(1 for k in best if k) == 1 else MIXED_POLICIES
            jobs += [(i, best, pol) for pol in policies]
        results = self.run_all([self.task(c, pol, phase_index=i) for i, c, pol in jobs])
        alone: dict[tuple[int, tuple[int, ...]], float] = {}
        for (i, c, _), ms in zip(jobs, results, strict=True):
            alone[(i, c)] = max(alone.get((i, c), -1.0), _phase_score(ms[0], self.objective))
        schedule: list[tuple[tuple[int, ...], float]] = []
        for i, ph in enumerate(self.phases):
            best = best_of[i]
            base_score = winner.phases[ph.name].score
            if best == winner_counts:
                schedule.append((winner_counts, base_score))
                continue
            mine, cand = alone[(i, winner_counts)], alone[(i, best)]
            s = base_score * cand / mine if mine > 0 else 0.0
            self.log(f"  reshape {ph.name}: {_label(self.types, best)} {cand:.1f} vs {winner.fleet} {mine:.1f} alone")
            schedule.append((best, s) if s > base_score else (winner_counts, base_score))
        switches: list[Switch] = []
        total = sum(self.spans)
        value = sum(s * span for (_, s), span in zip(schedule, self.spans, strict=False))
        for i in range(len(schedule)):
            prev, cur = schedule[i - 1][0], schedule[i][0]
            if prev == cur or len(schedule) == 1:
                continue
            changed = sum(max(0, a - b) for a, b in zip(cur, prev, strict=False))
            downtime = changed * restart_s
            short = list(cur)
            short[max(range(len(short)), key=lambda j: short[j])] -= 1  # one server down at a time
            curves = [
                (k, type_curve(t, self.base, self.phases[i])) for t, k in zip(self.types, short, strict=True) if k
            ]
            degraded = fleet_value(curves, self.rates[i]) if curves else 0.0
            # the simulated score of the phase, scaled by what one server fewer costs in the fluid model
            full_fluid = fluid[cur][i]
            kept = degraded / full_fluid if full_fluid > 0 else 0.0
            cost = min(downtime, self.spans[i]) * schedule[i][1] * max(0.0, 1.0 - kept)
            value -= cost
            switches.append(
                Switch(
                    before=self.phases[i - 1].name,
                    after=self.phases[i].name,
                    fleet=_label(self.types, cur),
                    servers_restarted=changed,
                    downtime_s=downtime,
                    cost=cost,
                )
            )
        reshape_score = value / total
        gain = reshape_score / winner.score - 1 if winner.score > 0 else 0.0
        sched = {ph.name: _label(self.types, c) for ph, (c, _) in zip(self.phases, schedule, strict=False)}
        if not switches:
            advice = f"keep {winner.fleet} all day: no phase's best fleet beats it in simulation"
        elif gain <= 0.02:
            advice = (
                f"keep {winner.fleet}: reshaping ({len(switches)} switches) would gain {100 * gain:+.1f}% "
                f"after {restart_s / 60:.0f} min restarts, not worth the risk"
            )
        else:
            parts = ", ".join(f"{sw.after} -> {sw.fleet}" for sw in switches)
            advice = (
                f"reshape over the day ({parts}): {100 * gain:+.1f}% over {winner.fleet} all day, "
                f"net of {restart_s / 60:.0f} min per restarted server"
            )
        return Reshape(
            schedule=sched,
            static_score=winner.score,
            reshape_score=reshape_score,
            gain=gain,
            switches=switches,
            restart_s=restart_s,
            advice=advice,
        )


CONFIRM_SEEDS = 2
CONFIRM_LEADERS = 3


def _parity_floor(figures: Iterable[FleetFigures]) -> float:
    """The worst-phase SLO attainment a fleet needs to rank ahead: the most reliable homogeneous
    fleet's, less SLO_PARITY (homogeneous: a handful of fleets, so the maximum of their noisy
    figures is not biased upwards as the maximum over a hundred compositions would be)."""
    return max(f.worst_slo for f in figures if f.homogeneous) - SLO_PARITY


def rank_fleets(figures: list[FleetFigures]) -> tuple[list[FleetFigures], FleetFigures]:
    """The simulated fleets in plan order, and the best homogeneous one (step 3 of the module
    docstring); sets each one's `slo_parity`, `margin` and `tie`. Needs a homogeneous fleet."""
    floor = _parity_floor(figures)
    for f in figures:
        f.slo_parity = f.worst_slo >= floor
    ranked = sorted(figures, key=lambda f: (not f.slo_parity, -f.score))
    best_h = next(f for f in ranked if f.homogeneous)
    for f in figures:
        f.margin = f.score / best_h.score - 1 if best_h.score > 0 else 0.0
        f.tie = f is ranked[0] or (f.slo_parity and within_noise(ranked[0], f))
    if best_h.tie and ranked[0] is not best_h:
        # a mix that the seeds cannot tell from the best homogeneous fleet is not worth running two
        # kinds of server: the homogeneous fleet leads the ties
        ranked.remove(best_h)
        ranked.insert(0, best_h)
    return ranked, best_h


def within_noise(leader: FleetFigures, other: FleetFigures) -> bool:
    """Whether `other` trails `leader` by no more than the seeds' noise: the mean of their paired
    differences (the same arrivals on each seed) within two standard errors of zero, or within
    TIE_FLOOR of the leader's score when the seeds agree too closely to estimate the noise."""
    diffs = [a - b for a, b in zip(leader.seed_scores, other.seed_scores, strict=True)]
    mean = sum(diffs) / len(diffs)
    spread = 0.0
    if len(diffs) > 1:
        var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        spread = 2.0 * math.sqrt(var / len(diffs))
    return mean <= max(spread, TIE_FLOOR * leader.score)


def _confirm(
    p: _Planner,
    everything: dict[tuple[int, ...], FleetFigures],
    pick: tuple[int, ...],
    fluid: dict[tuple[int, ...], float],
) -> Exhaustive:
    leaders = sorted(everything, key=lambda c: -everything[c].score)[:CONFIRM_LEADERS]
    fleets = list(dict.fromkeys([*leaders, pick]))
    seeds = [p.seeds[-1] + 1 + k for k in range(CONFIRM_SEEDS)]
    means = {c: f.score for c, f in p.figures_all([(c, fluid[c]) for c in fleets], seeds=seeds).items()}
    best = max(fleets, key=lambda c: means[c])
    gap = means[pick] / means[best] - 1 if means[best] > 0 else 0.0
    return Exhaustive(
        seeds=seeds,
        pick=_label(p.types, pick),
        pick_score=round(means[pick], 3),
        best=_label(p.types, best),
        best_score=round(means[best], 3),
        gap=round(gap, 4),
        leaders={_label(p.types, c): round(means[c], 3) for c in fleets},
        scores={f.fleet: round(f.score, 3) for f in everything.values()},
    )


def _assumptions(p: _Planner, restart_s: float, sample_s: float) -> list[str]:
    ref = p.traffic.scenario.reference
    return [
        f"servers: twin profiles on the virtual clock ({', '.join(t.label for t in p.types)}); "
        "step times, acceptance and reasoning lengths as the profiles state (their provenance)",
        f"load: phase rates {', '.join(f'{r:.2f}' for r in p.rates)} req/s"
        + (
            ""
            if all(r is not None for r in p.traffic.rates)
            else f" (loads are fractions of {p.n} x {ref}'s saturation rate on each phase's traffic)"
        ),
        f"each phase simulated for {sample_s:.0f} s of steady traffic"
        + "".join(
            f", {ph.name} for {ph.duration_s:.0f} s "
            + ("(the trace's window at its speed-up)" if ph.arrival == "trace" else f"({BURST_CYCLES} burst cycles)")
            for ph in p.phases
            if ph.duration_s != sample_s
        )
        + f", weighed by the part of the day it stands for; scores are means over seeds {p.seeds}, every fleet "
        "drawing the same arrivals on a seed",
        f"score: span-weighted mean request decode tok/s, a request missing the SLO ({p.slo.label}: shed, "
        "unfinished or late) counting 0"
        if p.objective == "tok_s"
        else f"score: span-weighted requests/s meeting the SLO ({p.slo.label})",
        "policies: goodput (latency and throughput objectives) for mixed fleets; goodput and SGLang's router's "
        "cache_aware (implemented from its source) for homogeneous ones; each fleet with its best policy "
        "that meets the SLO about as often as its most reliable one",
        f"restart of a 1T-parameter server: {restart_s / 60:.0f} min down (assumption: ~600 GB INT4 weights "
        "at ~1.5 GB/s, drafter, CUDA graphs, warm-up), rolling one server at a time",
        f"SGLang --max-queued-requests {p.base.max_queued} per server; a full queue is a 503, retried once "
        "elsewhere, then shed",
    ]


def plan(
    n: int,
    traffic: Traffic,
    *,
    slo: SLO = DEFAULT_SLO,
    types: Sequence[str] = DEFAULT_TYPES,
    objective: str = "tok_s",
    shortlist: int = 3,
    homogeneous: int = 2,
    sample_s: float = 90.0,
    seed: int = 0,
    seeds: int = SEEDS,
    restart_s: float = RESTART_S,
    exhaustive: bool = False,
    jobs: int | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> PlanResult:
    t0 = time.perf_counter()
    jobs = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    p = _Planner(
        n,
        traffic,
        slo=slo,
        types=types,
        objective=objective,
        sample_s=sample_s,
        seed=seed,
        log=log,
        jobs=jobs,
        seeds=seeds,
    )
    combos = compositions(len(p.types), n)
    grids = p.grids()
    fluid_phase = {c: [g.value(c) for g in grids] for c in combos}
    fluid = {c: p.weighted(v) for c, v in fluid_phase.items()}
    # The fluid ranking mirrors the simulated one: a fleet whose capacity falls short of a phase's
    # rate (a speculative server's cap of 48 running requests binds where an AR server's batch
    # still grows) queues without bound there and misses the SLO, however fast the requests it
    # serves; so fleets that carry every phase about as fully as the fleet that carries most
    # come first, each group by its mean request tok/s.
    headroom = {c: min(g.headroom(c) for g in grids) for c in combos}
    carried = {c: min(1.0, h) for c, h in headroom.items()}
    reliable = max(carried.values()) - SLO_PARITY
    ordered = sorted(combos, key=lambda c: (carried[c] < reliable, -fluid[c]))
    homog = [c for c in ordered if sum(1 for k in c if k) == 1]
    mixed = [c for c in ordered if sum(1 for k in c if k) > 1]
    # and the homogeneous fleet with the most capacity for the traffic: the safe alternative
    roomiest = max(homog, key=lambda c: headroom[c])
    # The fluid model's split is domain-blind: it cannot see a server of another type taking the
    # requests that slow the others most (long contexts, overflow at a peak). So the best
    # homogeneous fleet with one server swapped for each other type is simulated too.
    variants = []
    for t in range(len(p.types)):
        for o in range(len(p.types)):
            base = homog[0]
            if o != t and base[t] and n > 1:
                v = list(base)
                v[t] -= 1
                v[o] += 1
                variants.append(tuple(v))
    picked = list(dict.fromkeys([*homog[:homogeneous], roomiest, *mixed[:shortlist], *variants]))
    log(
        f"fluid model: {len(combos)} compositions of {n} servers over {len(p.types)} types; "
        f"simulating {len(picked)}: " + ", ".join(_label(p.types, c) for c in picked)
    )
    figures = p.figures_all([(c, fluid[c]) for c in picked])
    # fleets that meet the SLO in their worst phase about as often as the most reliable homogeneous
    # fleet simulated (a user's real alternative) first: a higher mean bought with more misses
    # (queues past the servers' caps) is not a better fleet
    ranked, best_h = rank_fleets(list(figures.values()))
    winner_counts = next(c for c, f in figures.items() if f is ranked[0])
    reshape = p.reshape(winner_counts, ranked[0], fluid_phase, restart_s) if len(p.phases) > 1 else None
    fresh = None
    if ranked[0] is not best_h:
        homog_counts = next(c for c, f in figures.items() if f is best_h)
        fresh_seeds = [p.seeds[-1] + 1 + k for k in range(CONFIRM_SEEDS)]
        pairs = [
            p.scores_on([(winner_counts, ranked[0].policy), (homog_counts, best_h.policy)], s) for s in fresh_seeds
        ]
        fresh = FreshSeeds(seeds=fresh_seeds, margins=[round(w / h - 1, 4) if h > 0 else 0.0 for w, h in pairs])
    exhaustive_best = None
    check: Exhaustive | None = None
    if exhaustive:
        log(f"exhaustive: simulating all {len(combos)} compositions")
        everything = {**p.figures_all([(c, fluid[c]) for c in combos if c not in figures]), **figures}
        floor = _parity_floor(everything.values())  # the same rule as the ranking
        everything = {c: f for c, f in everything.items() if f.worst_slo >= floor}
        exhaustive_best = max(everything.values(), key=lambda f: f.score)
        check = _confirm(p, everything, winner_counts, fluid)
    return PlanResult(
        servers=n,
        seed=seed,
        seeds=p.seeds,
        traffic=traffic.name,
        objective=objective,
        slo=slo,
        types=[t.label for t in p.types],
        rates_rps={ph.name: round(r, 4) for ph, r in zip(p.phases, p.rates, strict=False)},
        spans_s={ph.name: ph.span_s for ph in p.phases},
        ranked=ranked,
        best_homogeneous=best_h,
        reshape=reshape,
        compositions=len(combos),
        simulated=p.simulated,
        sample_s=sample_s,
        assumptions=_assumptions(p, restart_s, sample_s),
        wall_s=time.perf_counter() - t0,
        exhaustive_best=exhaustive_best,
        exhaustive=check,
        fresh=fresh,
    )
