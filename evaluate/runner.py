"""Run every contestant through a scenario and compare them.

Contestants:
- specroute's policies: the baselines (least_inflight, round_robin, threshold) and `goodput`
  per objective;
- SGLang's router's policies (`sglang/round_robin`, `sglang/power_of_two`, `sglang/least_load`,
  `sglang/cache_aware`; `evaluate.peers`, implemented from the router's source);
- `static/NAME`, one per server type of the fleet: in a closed loop all clients on that backend
  (the closed loop's meaning); in an open loop that backend alone serving a 1/N share of the
  arrivals (the fleet's traffic would swamp a single server; a share is what it would get behind
  an ideal balancer, so "the best single backend" stays a fair comparison), measured on N such
  servers, each with every N-th session: the same requests the fleet is judged on (a night phase
  holds a few dozen requests; a share drawn on its own would be a different, smaller sample);
- `clairvoyant/OBJECTIVE`: the goodput decision rule with the twin's true acceptance and step time
  per domain and no exploration (`evaluate.oracle`), the reference for learning quality;
- `clairvoyant/e2e` in open-loop scenarios: per request the backend with the smallest true
  predicted e2e (`evaluate.clairvoyant`: live queues, cache contents, the request's own
  acceptance and length).

Every contestant sees the same request stream (same seed) on freshly built engines. Regret: per
phase, how far a contestant's mean request tok/s is below the best static backend's in that
phase (`regret`, negative when it is above), and over the scenario below the best static choice
in hindsight (the one static backend with the best phase mean over the whole scenario).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from backends import BackendSpec
from evaluate.bound import PhaseCeiling, phase_ceiling
from evaluate.clairvoyant import Clairvoyant
from evaluate.fleet import fleet_label, parse_fleet
from evaluate.metrics import PhaseMetrics, metric_of, phase_metrics, pooled_phase_metrics, window_series
from evaluate.oracle import OracleEstimates
from evaluate.peers import PEER_POLICIES, make_peer
from evaluate.scenarios import Scenario
from evaluate.sim import RunResult, build_engines, fleet_servers, simulate
from evaluate.slo import DEFAULT_SLO, SLO
from policies.base import Policy
from policies.goodput import OBJECTIVES, Goodput
from policies.simple import LeastInflight, Pinned, RoundRobin
from policies.threshold import Threshold
from twin.engine import Engine

__all__ = ["PhaseResult", "ScenarioResult", "clairvoyant_rule", "contestants", "on_fleet", "run_scenario"]

Factory = Callable[[dict[str, Engine], list[BackendSpec]], Policy]
RECOVERY_WINDOW_S = 20.0
RECOVERY_STEP_S = 5.0
RECOVERY_RATIO = 0.95
COLD_START_S = 60.0
CEILING_MAX_CLIENTS = 256  # the closed-loop ceiling's search grows with clients^2 per backend


class PhaseResult(msgspec.Struct, kw_only=True):
    name: str
    concurrency: int
    duration_s: float
    domains: dict[str, float]
    policies: dict[str, PhaseMetrics]
    ceiling: PhaseCeiling | None = None  # the best mean request tok/s the pool allows (eval.bound)
    arrival: str = "closed"
    load: float = 0.0
    rate_rps: float = 0.0  # open loop: requests/s offered


class ScenarioResult(msgspec.Struct, kw_only=True):
    name: str
    description: str
    pool: list[str]
    objectives: list[str]
    phases: list[PhaseResult]
    # per contestant over the whole scenario: mean of the phase figures and request-weighted mean
    summary: dict[str, dict[str, float]]
    # degrade only: per objective, seconds after the drop until goodput stays >= 0.95 x clairvoyant
    recovery: dict[str, dict[str, Any]] = {}
    wall_s: float = 0.0
    fleet: str = ""
    slo: SLO = DEFAULT_SLO
    # per learning policy: its mean request tok/s over the first COLD_START_S vs clairvoyant's
    cold_start: dict[str, dict[str, float]] = {}


def _static_names(scenario: Scenario) -> dict[str, str]:
    """static/LABEL -> the first server of each member type."""
    out: dict[str, str] = {}
    for s in fleet_servers(scenario):
        out.setdefault(f"static/{s.member.label}", s.name)
    return out


def clairvoyant_rule(objective: str, seed: int, estimates: Any) -> Goodput:
    """Goodput's decision rule as the clairvoyant runs it, on `estimates` (any object with the
    interface of `Estimates`): no exploration, no optimism bonus."""
    return Goodput(objective, seed=seed, epsilon=0.0, bonus=0.0, estimates=estimates)


def contestants(
    pool: Sequence[str],
    objectives: Sequence[str],
    seed: int,
    goodput_options: dict[str, Any] | None = None,
    *,
    statics: dict[str, str] | None = None,
    peers: bool = True,
    e2e_clairvoyant: bool = False,
    slo: SLO = DEFAULT_SLO,
) -> dict[str, tuple[str | None, Factory]]:
    """Name -> (objective or None, factory). Factories get the run's engines and specs.

    specroute is configured with the SLO it is judged on (`ttft_slo_s`, `tpot_slo_s` in its
    config), as an operator who states one would; an explicit goodput option still wins."""
    opts = {"ttft_slo_s": slo.ttft_s, "tpot_slo_s": slo.tpot_s, **(goodput_options or {})}

    def goodput(obj: str) -> Factory:
        return lambda e, s: Goodput(obj, seed=seed, backends=s, **opts)

    def clairvoyant(obj: str) -> Factory:
        return lambda e, s: clairvoyant_rule(obj, seed, OracleEstimates(e))

    def peer(name: str) -> Factory:
        return lambda e, s: make_peer(name, seed)  # type: ignore[return-value]  # each peer class has choose()

    def pinned(server: str) -> Factory:
        return lambda e, s: Pinned(server)

    out: dict[str, tuple[str | None, Factory]] = {
        "least_inflight": (None, lambda e, s: LeastInflight(random.Random(seed))),
        "round_robin": (None, lambda e, s: RoundRobin()),
        "threshold": (None, lambda e, s: Threshold(seed=seed)),
    }
    for obj in objectives:
        out[f"goodput/{obj}"] = (obj, goodput(obj))
        out[f"clairvoyant/{obj}"] = (obj, clairvoyant(obj))
    if e2e_clairvoyant:
        out["clairvoyant/e2e"] = (None, lambda e, s: Clairvoyant(e))
    if peers:
        for name in PEER_POLICIES:
            out[name] = (None, peer(name))
    for key, server in (statics if statics is not None else {f"static/{n}": n for n in pool}).items():
        out[key] = (None, pinned(server))
    return out


def _request_mean(run: RunResult) -> float:
    vals = [v for v in (r.decode_tok_s for r in run.records) if v is not None]
    return sum(vals) / len(vals) if vals else 0.0


def _span_metric(run: RunResult, start: float, end: float, objective: str) -> float:
    ((_, value),) = window_series(run, start, end, end - start, end - start, objective)
    return value


def _recovery(goodput: RunResult, oracle: RunResult, scenario: Scenario, objective: str) -> dict[str, Any]:
    """How long after the drop goodput is back to RECOVERY_RATIO x clairvoyant.

    `recovery_s` is the first offset t (5 s steps) at which both the 20 s window starting at t
    and the whole rest of the run from t are at or above the ratio: recovered, and staying
    recovered on average (a single late window is too noisy to undo a recovery: at 8 clients it
    holds ~30 requests). `ratio_after_30s` is the ratio over [drop + 30 s, end].
    """
    deg = scenario.degrade
    assert deg is not None
    end = scenario.duration_s
    g = window_series(goodput, deg.at_s, end, RECOVERY_WINDOW_S, RECOVERY_STEP_S, objective)
    o = window_series(oracle, deg.at_s, end, RECOVERY_WINDOW_S, RECOVERY_STEP_S, objective)
    ratios = [(t - deg.at_s, (gv / ov) if ov > 0 else 1.0) for (t, gv), (_, ov) in zip(g, o, strict=False)]

    def rest(t: float) -> float:
        ref = _span_metric(oracle, deg.at_s + t, end, objective)
        return _span_metric(goodput, deg.at_s + t, end, objective) / ref if ref > 0 else 1.0

    recovered: float | None = None
    for t, r in ratios:
        if r >= RECOVERY_RATIO and rest(t) >= RECOVERY_RATIO:
            recovered = t
            break
    return {
        "recovery_s": recovered,
        "window_s": RECOVERY_WINDOW_S,
        "ratio_after_30s": round(rest(30.0), 3),
        "ratios": [(round(t, 1), round(r, 3)) for t, r in ratios],
    }


def _cold_start(run: RunResult, reference: RunResult) -> dict[str, float]:
    """Mean request tok/s of requests sent in the first COLD_START_S, against the reference's:
    what starting from priors (or a short measurement) costs before the estimates settle."""

    def mean(r: RunResult) -> float:
        vals = [v for x in r.records if x.t_send < COLD_START_S and (v := x.decode_tok_s) is not None]
        return sum(vals) / len(vals) if vals else 0.0

    a, b = mean(run), mean(reference)
    return {
        "window_s": COLD_START_S,
        "request_tok_s": round(a, 2),
        "reference_tok_s": round(b, 2),
        "regret": round(1.0 - a / b, 4) if b > 0 else 0.0,
    }


def _static_share_runs(scenario: Scenario, member: str, rates: list[float], seed: int) -> list[RunResult]:
    """N servers of `member`, each alone with every N-th session of the open-loop arrivals (the
    same sessions at the same times as the fleet's run): together they serve the fleet's sample."""
    n = len(fleet_servers(scenario))
    alone = msgspec.structs.replace(scenario, pool=(member,), degrade=None)
    name = next(iter(build_engines(alone, seed)))
    return [simulate(alone, lambda e, s: Pinned(name), seed=seed, phase_rates=rates, share=(k, n)) for k in range(n)]


def on_fleet(scenario: Scenario, fleet: str) -> Scenario:
    """The scenario with another fleet (validated; a degrade aimed at a backend not in it is dropped)."""
    members = parse_fleet(fleet)
    pool = tuple(m.label if m.count == 1 else f"{m.count}x{m.label}" for m in members)
    moved = msgspec.structs.replace(scenario, pool=pool)
    names = {s.name for s in fleet_servers(moved)}
    if moved.degrade is not None and moved.degrade.backend not in names:
        moved = msgspec.structs.replace(moved, degrade=None)
    return moved


def run_scenario(
    scenario: Scenario,
    *,
    seed: int = 0,
    objectives: Sequence[str] = OBJECTIVES,
    primary: str = "latency",
    only: Sequence[str] | None = None,
    goodput_options: dict[str, Any] | None = None,
    slo: SLO = DEFAULT_SLO,
    peers: bool = True,
) -> ScenarioResult:
    """Run all contestants (or those named in `only`) and compute per-phase metrics and ratios."""
    t0 = time.perf_counter()
    servers = fleet_servers(scenario)
    pool = [s.name for s in servers]
    statics = _static_names(scenario)
    table = contestants(
        pool,
        objectives,
        seed,
        goodput_options,
        statics=statics,
        peers=peers,
        e2e_clairvoyant=scenario.open_loop,
        slo=slo,
    )
    if only is not None:
        wanted = set(only) | {f"clairvoyant/{o}" for o in objectives}
        table = {k: v for k, v in table.items() if k in wanted}
    runs: dict[str, RunResult] = {}
    metrics: dict[str, list[PhaseMetrics]] = {}
    rates: list[float] | None = None
    for key, (_, factory) in table.items():
        if key.startswith("static/") and scenario.open_loop:
            continue
        runs[key] = simulate(scenario, factory, seed=seed)
        rates = runs[key].phase_rates
        metrics[key] = phase_metrics(runs[key], scenario, pool, slo=slo)
    for key in table:
        if key.startswith("static/") and scenario.open_loop:
            assert rates is not None, "open-loop statics need another contestant's rates"
            member = next(s.member.label for s in servers if s.name == statics[key])
            parts = _static_share_runs(scenario, member, rates, seed)
            runs[key] = msgspec.structs.replace(
                parts[0],
                records=[r for p in parts for r in p.records],
                failed=[r for p in parts for r in p.failed],
                tokens_at=[],  # each part has its own phase timeline: metrics pool the parts
            )
            alone = msgspec.structs.replace(scenario, pool=(member,))
            metrics[key] = pooled_phase_metrics(parts, alone, [member], slo=slo)
            for m in metrics[key]:  # report the share under the fleet's server name
                m.backend_share = {statics[key]: 1.0}
    for key, (obj, _) in table.items():
        for i, m in enumerate(metrics[key]):
            ratios = {}
            for o in objectives:
                ref = metric_of(metrics[f"clairvoyant/{o}"][i], o)
                ratios[o] = metric_of(m, o) / ref if ref > 0 else 1.0
            m.clairvoyant_ratios = ratios
            m.clairvoyant_ratio = ratios.get(obj or primary, next(iter(ratios.values()), None))
            best_static = max((metrics[s][i].mean_request_tok_s for s in table if s.startswith("static/")), default=0.0)
            m.regret = 1.0 - m.mean_request_tok_s / best_static if best_static > 0 else None
    engines = build_engines(scenario, seed)
    phases = []
    for i, ph in enumerate(scenario.phases):
        ceiling = (
            phase_ceiling(engines, ph)
            if not ph.open_loop and ph.mix is None and ph.concurrency <= CEILING_MAX_CLIENTS
            else None
        )
        phases.append(
            PhaseResult(
                name=ph.name,
                concurrency=ph.concurrency,
                duration_s=ph.duration_s,
                domains=dict(ph.domains),
                policies={k: metrics[k][i] for k in table},
                ceiling=ceiling,
                arrival=ph.arrival,
                load=ph.load,
                rate_rps=rates[i] if rates else 0.0,
            )
        )
    summary = {}
    static_means = {
        k: sum(m.mean_request_tok_s for m in metrics[k]) / len(metrics[k]) for k in table if k.startswith("static/")
    }
    best_hindsight = max(static_means.values(), default=0.0)
    for key in table:
        ms = metrics[key]
        phase_mean = sum(m.mean_request_tok_s for m in ms) / len(ms)
        summary[key] = {
            "phase_mean_request_tok_s": phase_mean,
            "phase_mean_aggregate_tok_s": sum(m.aggregate_tok_s for m in ms) / len(ms),
            "mean_request_tok_s": _request_mean(runs[key]),
            "requests": float(len(runs[key].records)),
            "min_clairvoyant_ratio": min(m.clairvoyant_ratio or 0.0 for m in ms),
            "shed": float(sum(m.shed for m in ms)),
            "phase_mean_goodput_rps": sum(m.goodput_rps for m in ms) / len(ms),
            "hindsight_regret": 1.0 - phase_mean / best_hindsight if best_hindsight > 0 else 0.0,
        }
    recovery = {}
    if scenario.degrade is not None:
        for o in objectives:
            if f"goodput/{o}" in runs:
                recovery[o] = _recovery(runs[f"goodput/{o}"], runs[f"clairvoyant/{o}"], scenario, o)
    reference = runs.get(f"clairvoyant/{primary}") or runs.get("clairvoyant/e2e")
    cold = {k: _cold_start(runs[k], reference) for k in runs if reference is not None and k.startswith("goodput/")}
    return ScenarioResult(
        name=scenario.name,
        description=scenario.description,
        pool=pool,
        objectives=list(objectives),
        phases=phases,
        summary=summary,
        recovery=recovery,
        wall_s=time.perf_counter() - t0,
        fleet=fleet_label(parse_fleet(",".join(scenario.pool))),
        slo=slo,
        cold_start=cold,
    )
