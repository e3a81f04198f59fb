"""The fleet targets (docs/evaluation.md), checked on one scenario run on the plan's fleet and on every
homogeneous fleet.

Judged phases: every phase of `day` and `sessions`, the 60% and 90% phases of the open-loop load
ladders (`open-poisson`, `open-bursty`). Per judged phase:

1. the plan's fleet routed by goodput (the objective plan chose for it) gives >= 1.2x the mean request tok/s of the best
   homogeneous fleet of the same size behind the best SGLang-router policy *of that phase* (the
   strongest baseline: the best (fleet, router policy) pair is picked per phase, in hindsight);
2. its e2e p99 and TTFT p99 are no worse than that baseline's;
3. it is >= 0.95x the clairvoyant reference (goodput's rule with the twin's truths) on its fleet;
4. it is never below least_inflight or the best single backend on its fleet.
Sessions (`sessions`): goodput's TTFT p50 <= cache_aware's on the same fleet, with mean request
tok/s at least cache_aware's (the decode gain of speculation kept).

Where target 1 fails, the bound says how far any fleet and any routing could go in this world,
from the fluid model (`evaluate.fluid`), steady state:
- composition factor: the best fluid value of any composition of N servers over plan's types /
  the best homogeneous one's (what mixing server types adds under an ideal domain-blind split);
- affinity factor: if every request went to the server type fastest *for it* at the load that
  type would carry with an equal share of the phase, / the best single type for all (what
  per-request routing on domain, temperature and context adds on top);
- bound = their product x the best homogeneous fleet's fluid value / its measured baseline
  (the fluid model's optimism at this phase; at least 1: where the model sits below the measured
  baseline, the routing factors alone), over the measured baseline: the ratio no fleet of these
  types with any policy is expected to pass. Below 1.2x, target 1 is out of reach here.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from evaluate.fleet import parse_fleet, parse_member
from evaluate.fluid import PhaseGrid, request_rates, type_curve
from evaluate.metrics import PhaseMetrics
from evaluate.runner import PhaseResult, ScenarioResult
from evaluate.scenarios import SCENARIOS, Scenario
from evaluate.targets import Target

__all__ = ["JUDGED", "check_fleet_targets", "fleet_table", "fluid_bound"]

SPEEDUP = 1.2
CLAIRVOYANT = 0.95
JUDGED = {"open-poisson": ("load-60", "load-90"), "open-bursty": ("load-60", "load-90")}  # others: all phases
POLICY = "goodput/latency"


def _judged(scenario: str, phases: Sequence[str]) -> list[str]:
    return [p for p in phases if p in JUDGED.get(scenario, tuple(phases))]


def _baseline(homog: Sequence[ScenarioResult], phase: str) -> tuple[str, str, PhaseMetrics] | None:
    best: tuple[str, str, PhaseMetrics] | None = None
    for res in homog:
        ph = next(p for p in res.phases if p.name == phase)
        for k, m in ph.policies.items():
            if k.startswith("sglang/") and (best is None or m.mean_request_tok_s > best[2].mean_request_tok_s):
                best = (res.fleet, k, m)
    return best


def fluid_bound(
    scenario: Scenario,
    phase_name: str,
    n: int,
    rate: float,
    baseline_tok_s: float,
    type_names: Sequence[str] | None = None,
) -> dict[str, float]:
    """The bound of the module docstring for one phase, over `type_names` (default plan's types)."""
    from evaluate.plan import DEFAULT_TYPES, compositions

    phase = next(p for p in scenario.phases if p.name == phase_name)
    types = [parse_member(t) for t in (type_names or DEFAULT_TYPES)]
    grid = PhaseGrid([type_curve(t, scenario, phase) for t in types], rate)
    combos = compositions(len(types), n)
    values = {c: grid.value(c) for c in combos}
    best_any = max(values.values())
    best_h = max(v for c, v in values.items() if sum(1 for k in c if k) == 1)
    per_type = [request_rates(t, scenario, phase, rate / n) for t in types]
    feasible = [r for r in per_type if r is not None]
    affinity = 1.0
    if feasible:
        stack = np.vstack(feasible)
        affinity = float(np.mean(stack.max(axis=0)) / stack.mean(axis=1).max())
    composition = best_any / best_h if best_h > 0 else 1.0
    optimism = best_h / baseline_tok_s if baseline_tok_s > 0 else 1.0
    bound = composition * affinity * max(1.0, optimism) if baseline_tok_s > 0 else 0.0
    return {
        "composition": round(composition, 3),
        "affinity": round(affinity, 3),
        "fluid_optimism": round(optimism, 3),
        "bound_ratio": round(bound, 3),
    }


class Bound(msgspec.Struct, kw_only=True):
    composition: float
    affinity: float
    fluid_optimism: float
    bound_ratio: float


class PhaseCheck(msgspec.Struct, kw_only=True):
    phase: str
    rate_rps: float
    plan_tok_s: float
    baseline: str  # "FLEET behind POLICY"
    baseline_tok_s: float
    ratio: float
    e2e_p99_s: tuple[float, float]  # plan, baseline
    ttft_p99_ms: tuple[float, float]
    clairvoyant_ratio: float
    vs_least_inflight: float | None
    vs_best_static: float | None
    bound: Bound | None = None

    @property
    def worse_tail(self) -> bool:
        return self.e2e_p99_s[0] > self.e2e_p99_s[1] or self.ttft_p99_ms[0] > self.ttft_p99_ms[1]


def _check_phase(
    scenario: Scenario, ph: PhaseResult, homog: Sequence[ScenarioResult], n: int, policy: str
) -> PhaseCheck | None:
    mine = ph.policies[policy]
    base = _baseline(homog, ph.name)
    if base is None:
        return None
    fleet, peer, b = base
    top_static = max((m.mean_request_tok_s for k, m in ph.policies.items() if k.startswith("static/")), default=0.0)
    li = ph.policies["least_inflight"].mean_request_tok_s
    ratio = mine.mean_request_tok_s / b.mean_request_tok_s if b.mean_request_tok_s else 0.0
    return PhaseCheck(
        phase=ph.name,
        rate_rps=round(ph.rate_rps, 3),
        plan_tok_s=round(mine.mean_request_tok_s, 2),
        baseline=f"{fleet} behind {peer}",
        baseline_tok_s=round(b.mean_request_tok_s, 2),
        ratio=round(ratio, 3),
        e2e_p99_s=(round(mine.p99_e2e_s, 1), round(b.p99_e2e_s, 1)),
        ttft_p99_ms=(round(mine.p99_ttft_ms), round(b.p99_ttft_ms)),
        clairvoyant_ratio=round(mine.clairvoyant_ratio or 0.0, 3),
        vs_least_inflight=round(mine.mean_request_tok_s / li, 3) if li else None,
        vs_best_static=round(mine.mean_request_tok_s / top_static, 3) if top_static else None,
        bound=msgspec.convert(fluid_bound(scenario, ph.name, n, ph.rate_rps, b.mean_request_tok_s), Bound)
        if ratio < SPEEDUP
        else None,
    )


def _fleet_targets(scenario: str, plan: ScenarioResult, rows: Sequence[PhaseCheck], policy: str) -> list[Target]:
    where = f"{scenario} ({plan.fleet} behind {policy})"
    worst = min(rows, key=lambda r: r.ratio)
    bounds = [r.bound.bound_ratio for r in rows if r.bound is not None]
    bound_txt = f"; bound (fluid, any fleet and policy) min {min(bounds):.2f}x" if bounds else ""
    detail = []
    for r in rows:
        line = f"{r.phase}: {r.plan_tok_s} vs {r.baseline_tok_s} ({r.baseline}) = {r.ratio}x"
        if r.bound is not None:
            line += (
                f", bound {r.bound.bound_ratio}x (composition {r.bound.composition}, affinity "
                f"{r.bound.affinity}, fluid/measured {r.bound.fluid_optimism})"
            )
        detail.append(line)
    out = [
        Target(
            name=f"{where}: goodput >= {SPEEDUP}x best homogeneous fleet behind the best SGLang router, judged phases",
            holds=all(r.ratio >= SPEEDUP for r in rows),
            value=f"min {worst.ratio:.2f}x ({worst.phase} vs {worst.baseline}), "
            f"mean {sum(r.ratio for r in rows) / len(rows):.2f}x{bound_txt}",
            detail=detail,
        )
    ]
    worse = [r for r in rows if r.worse_tail]
    out.append(
        Target(
            name=f"{where}: e2e p99 and TTFT p99 no worse than that baseline",
            holds=not worse,
            value=f"{len(rows) - len(worse)} of {len(rows)} phases",
            detail=[
                f"{r.phase}: e2e p99 {r.e2e_p99_s[0]} vs {r.e2e_p99_s[1]} s, TTFT p99 "
                f"{r.ttft_p99_ms[0]} vs {r.ttft_p99_ms[1]} ms"
                for r in worse
            ],
        )
    )
    low = min(rows, key=lambda r: r.clairvoyant_ratio)
    out.append(
        Target(
            name=f"{where}: goodput >= {CLAIRVOYANT}x clairvoyant in every judged phase",
            holds=all(r.clairvoyant_ratio >= CLAIRVOYANT for r in rows),
            value=f"min {low.clairvoyant_ratio:.3f} ({low.phase})",
        )
    )
    floor = min(min(r.vs_least_inflight or 9.9, r.vs_best_static or 9.9) for r in rows)
    out.append(
        Target(
            name=f"{where}: goodput never below least_inflight or the best single backend",
            holds=floor >= 1.0,
            value=f"min {floor:.3f}x",
            detail=[
                f"{r.phase}: vs least_inflight {r.vs_least_inflight}, vs best static {r.vs_best_static}" for r in rows
            ],
        )
    )
    return out


def _session_target(res: ScenarioResult) -> Target | None:
    rows = []
    for ph in res.phases:
        g, c = ph.policies.get(POLICY), ph.policies.get("sglang/cache_aware")
        if g is not None and c is not None:
            rows.append((ph.name, g.p50_ttft_ms, c.p50_ttft_ms, g.mean_request_tok_s, c.mean_request_tok_s))
    if not rows:
        return None
    return Target(
        name=f"sessions ({res.fleet}): goodput TTFT p50 <= cache_aware's, request tok/s kept",
        holds=all(t <= ct and r >= cr for _, t, ct, r, cr in rows),
        value="; ".join(f"{n}: TTFT p50 {t:.0f} vs {ct:.0f} ms, {r:.1f} vs {cr:.1f} tok/s" for n, t, ct, r, cr in rows),
    )


def check_fleet_targets(
    groups: dict[str, list[tuple[str, ScenarioResult]]],
    plan_policy: dict[str, str],
    scenarios: dict[str, Scenario] | None = None,
) -> tuple[list[Target], dict[str, object]]:
    """`plan_policy`: the goodput objective plan chose for its fleet, per scenario (default latency);
    `scenarios`: the scenarios run, by name (default: the named ones; a trace is not among them)."""
    targets: list[Target] = []
    doc: dict[str, object] = {}
    known = {**SCENARIOS, **(scenarios or {})}
    for scenario, runs in groups.items():
        plan = next((r for role, r in runs if role == "plan"), None)
        homog = [r for role, r in runs if role == "homogeneous"]
        if plan is not None and homog:
            n = sum(m.count for m in parse_fleet(plan.fleet))
            policy = plan_policy.get(scenario, POLICY)
            policy = policy if policy.startswith("goodput/") else POLICY  # "routed by goodput"
            judged = set(_judged(scenario, [p.name for p in plan.phases]))
            rows = [
                c
                for ph in plan.phases
                if ph.name in judged and (c := _check_phase(known[scenario], ph, homog, n, policy)) is not None
            ]
            doc[scenario] = {
                "plan_fleet": plan.fleet,
                "policy": policy,
                "homogeneous": [r.fleet for r in homog],
                "phases": msgspec.to_builtins(rows),
            }
            if rows:
                targets += _fleet_targets(scenario, plan, rows, policy)
        if scenario == "sessions":
            for role, res in runs:
                if role in ("plan", "own", "given") and (t := _session_target(res)) is not None:
                    targets.append(t)
    return targets, doc


def fleet_table(groups: dict[str, list[tuple[str, ScenarioResult]]]) -> list[str]:
    """Fleet vs fleet: per scenario and phase, each fleet's best policy by mean request tok/s."""
    lines = [
        "Fleet vs fleet (same arrivals, same size): each fleet with its best policy of the phase by mean "
        "request tok/s, and goodput/latency on every fleet. req = mean request tok/s; SLO = attainment.",
        "",
        "| scenario | phase | fleet | role | best policy | req | goodput/latency req | TTFT p99 ms | e2e p99 s | SLO |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, runs in groups.items():
        if not any(role == "homogeneous" for role, _ in runs):
            continue
        for i, ph0 in enumerate(runs[0][1].phases):
            for role, res in runs:
                ph = res.phases[i]
                cands = {k: m for k, m in ph.policies.items() if not k.startswith(("clairvoyant", "static/"))}
                best = max(cands, key=lambda k: cands[k].mean_request_tok_s)
                m = cands[best]
                gp = ph.policies.get(POLICY)
                lines.append(
                    f"| {scenario} | {ph0.name} | {res.fleet} | {role} | {best} | "
                    f"{m.mean_request_tok_s:.1f} | {gp.mean_request_tok_s if gp else 0:.1f} | "
                    f"{m.p99_ttft_ms:.0f} | {m.p99_e2e_s:.1f} | "
                    f"{m.slo_attainment:.2f} |"
                )
    return lines
