"""Run every policy and every single backend through a scenario and compare them.

Contestants: the baselines (least_inflight, round_robin, threshold), `goodput` per objective,
`static/NAME` (all traffic to one backend), and `clairvoyant/OBJECTIVE`: the goodput decision
rule with the twin's true parameters and no exploration, the reference for learning quality.
Every contestant sees the same request stream (same seed) on freshly built engines.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Sequence

import msgspec

from backends import BackendSpec
from backends.sim.engine import Engine
from policies.base import Policy
from policies.eval.bound import PhaseCeiling, phase_ceiling
from policies.eval.metrics import PhaseMetrics, metric_of, phase_metrics, window_series
from policies.eval.oracle import OracleEstimates
from policies.eval.scenarios import Scenario
from policies.eval.sim import RunResult, build_engines, simulate
from policies.goodput import OBJECTIVES, Goodput
from policies.simple import LeastInflight, Pinned, RoundRobin
from policies.threshold import Threshold

__all__ = ["PhaseResult", "ScenarioResult", "contestants", "run_scenario"]

Factory = Callable[[dict[str, Engine], list[BackendSpec]], Policy]
RECOVERY_WINDOW_S = 20.0
RECOVERY_STEP_S = 5.0
RECOVERY_RATIO = 0.95


class PhaseResult(msgspec.Struct, kw_only=True):
    name: str
    concurrency: int
    duration_s: float
    domains: dict[str, float]
    policies: dict[str, PhaseMetrics]
    ceiling: PhaseCeiling | None = None  # the best mean request tok/s the pool allows (eval.bound)


class ScenarioResult(msgspec.Struct, kw_only=True):
    name: str
    description: str
    pool: list[str]
    objectives: list[str]
    phases: list[PhaseResult]
    # per contestant over the whole scenario: mean of the phase figures and request-weighted mean
    summary: dict[str, dict[str, float]]
    # degrade only: per objective, seconds after the drop until goodput stays >= 0.95 x clairvoyant
    recovery: dict[str, dict] = {}
    wall_s: float = 0.0


def contestants(pool: Sequence[str], objectives: Sequence[str], seed: int,
                goodput_options: dict | None = None) -> dict[str, tuple[str | None, Factory]]:
    """Name -> (objective or None, factory). Factories get the run's engines and specs."""
    opts = goodput_options or {}
    out: dict[str, tuple[str | None, Factory]] = {
        "least_inflight": (None, lambda e, s: LeastInflight(random.Random(seed))),
        "round_robin": (None, lambda e, s: RoundRobin()),
        "threshold": (None, lambda e, s: Threshold(seed=seed)),
    }
    for obj in objectives:
        out[f"goodput/{obj}"] = (obj, lambda e, s, obj=obj: Goodput(obj, seed=seed, backends=s, **opts))
        out[f"clairvoyant/{obj}"] = (obj, lambda e, s, obj=obj: Goodput(
            obj, seed=seed, epsilon=0.0, bonus=0.0, estimates=OracleEstimates(e)))  # type: ignore[arg-type]
    for name in pool:
        out[f"static/{name}"] = (None, lambda e, s, name=name: Pinned(name))
    return out


def _request_mean(run: RunResult) -> float:
    vals = [v for v in (r.decode_tok_s for r in run.records) if v is not None]
    return sum(vals) / len(vals) if vals else 0.0


def _span_metric(run: RunResult, start: float, end: float, objective: str) -> float:
    (_, value), = window_series(run, start, end, end - start, end - start, objective)
    return value


def _recovery(goodput: RunResult, oracle: RunResult, scenario: Scenario, objective: str) -> dict:
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
    ratios = [(t - deg.at_s, (gv / ov) if ov > 0 else 1.0) for (t, gv), (_, ov) in zip(g, o)]

    def rest(t: float) -> float:
        ref = _span_metric(oracle, deg.at_s + t, end, objective)
        return _span_metric(goodput, deg.at_s + t, end, objective) / ref if ref > 0 else 1.0

    recovered: float | None = None
    for t, r in ratios:
        if r >= RECOVERY_RATIO and rest(t) >= RECOVERY_RATIO:
            recovered = t
            break
    return {"recovery_s": recovered, "window_s": RECOVERY_WINDOW_S,
            "ratio_after_30s": round(rest(30.0), 3),
            "ratios": [(round(t, 1), round(r, 3)) for t, r in ratios]}


def run_scenario(scenario: Scenario, *, seed: int = 0, objectives: Sequence[str] = OBJECTIVES,
                 primary: str = "latency", only: Sequence[str] | None = None,
                 goodput_options: dict | None = None) -> ScenarioResult:
    """Run all contestants (or those named in `only`) and compute per-phase metrics and ratios."""
    t0 = time.perf_counter()
    pool = list(scenario.pool)
    table = contestants(pool, objectives, seed, goodput_options)
    if only is not None:
        wanted = set(only) | {f"clairvoyant/{o}" for o in objectives}
        table = {k: v for k, v in table.items() if k in wanted}
    runs: dict[str, RunResult] = {}
    metrics: dict[str, list[PhaseMetrics]] = {}
    for key, (_, factory) in table.items():
        runs[key] = simulate(scenario, factory, seed=seed)
        metrics[key] = phase_metrics(runs[key], scenario, pool)
    for key, (obj, _) in table.items():
        for i, m in enumerate(metrics[key]):
            ratios = {}
            for o in objectives:
                ref = metric_of(metrics[f"clairvoyant/{o}"][i], o)
                ratios[o] = metric_of(m, o) / ref if ref > 0 else 1.0
            m.clairvoyant_ratios = ratios
            m.clairvoyant_ratio = ratios.get(obj or primary, next(iter(ratios.values()), None))
    engines = build_engines(scenario, seed)
    phases = [PhaseResult(name=ph.name, concurrency=ph.concurrency, duration_s=ph.duration_s,
                          domains=dict(ph.domains),
                          policies={k: metrics[k][i] for k in table}, ceiling=phase_ceiling(engines, ph))
              for i, ph in enumerate(scenario.phases)]
    summary = {}
    for key in table:
        ms = metrics[key]
        summary[key] = {
            "phase_mean_request_tok_s": sum(m.mean_request_tok_s for m in ms) / len(ms),
            "phase_mean_aggregate_tok_s": sum(m.aggregate_tok_s for m in ms) / len(ms),
            "mean_request_tok_s": _request_mean(runs[key]),
            "requests": float(len(runs[key].records)),
            "min_clairvoyant_ratio": min(m.clairvoyant_ratio or 0.0 for m in ms),
        }
    recovery = {}
    if scenario.degrade is not None:
        for o in objectives:
            if f"goodput/{o}" in runs:
                recovery[o] = _recovery(runs[f"goodput/{o}"], runs[f"clairvoyant/{o}"], scenario, o)
    return ScenarioResult(name=scenario.name, description=scenario.description, pool=pool,
                          objectives=list(objectives), phases=phases, summary=summary,
                          recovery=recovery, wall_s=time.perf_counter() - t0)
