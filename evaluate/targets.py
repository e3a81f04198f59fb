"""The closed-loop acceptance targets, checked on evaluation results.

1. `goodput` >= 0.95 x `clairvoyant` in every phase of every scenario, for each objective;
2. latency objective: >= 1.3 x least_inflight's mean request tok/s over `mixed` and `ramp`
   (reported two ways: the mean of the per-phase figures, every phase weighing the same, and
   the mean over all requests of both scenarios, where high-concurrency phases dominate);
3. latency objective: aggregate tok/s never more than 5% below least_inflight's in any phase;
4. after the `degrade` drop, back to >= 0.95 x clairvoyant within 30 virtual seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from evaluate.runner import PhaseResult, ScenarioResult

__all__ = ["Target", "check_targets"]

RATIO = 0.95
SPEEDUP = 1.3
AGGREGATE_SLACK = 0.05
RECOVERY_S = 30.0


class Target(msgspec.Struct, kw_only=True):
    name: str
    holds: bool | None  # None: the scenarios it needs were not run
    value: str
    detail: list[str] = []


def _ratio_target(results: Sequence[ScenarioResult], objective: str) -> Target:
    key = f"goodput/{objective}"
    worst: tuple[float, str] | None = None
    misses = []
    for res in results:
        for ph in res.phases:
            m = ph.policies.get(key)
            if m is None or m.clairvoyant_ratio is None:
                continue
            r = m.clairvoyant_ratio
            where = f"{res.name}/{ph.name}"
            if worst is None or r < worst[0]:
                worst = (r, where)
            if r < RATIO:
                misses.append(f"{where}: {r:.3f}")
    if worst is None:
        return Target(name=f"goodput/{objective} >= {RATIO} x clairvoyant in every phase", holds=None, value="not run")
    return Target(
        name=f"goodput/{objective} >= {RATIO} x clairvoyant in every phase",
        holds=not misses,
        value=f"min {worst[0]:.3f} ({worst[1]})",
        detail=misses,
    )


def _speedup_target(by_name: dict[str, ScenarioResult]) -> Target:
    name = f"goodput/latency >= {SPEEDUP} x least_inflight mean request tok/s over mixed+ramp"
    runs = [by_name[n] for n in ("mixed", "ramp") if n in by_name]
    if len(runs) < 2 or any("goodput/latency" not in r.summary for r in runs):
        return Target(name=name, holds=None, value="not run")
    g_phase = [m for r in runs for m in (ph.policies["goodput/latency"].mean_request_tok_s for ph in r.phases)]
    l_phase = [m for r in runs for m in (ph.policies["least_inflight"].mean_request_tok_s for ph in r.phases)]
    phase_ratio = (sum(g_phase) / len(g_phase)) / (sum(l_phase) / len(l_phase))

    def request_mean(key: str) -> float:
        n = sum(r.summary[key]["requests"] for r in runs)
        return sum(r.summary[key]["mean_request_tok_s"] * r.summary[key]["requests"] for r in runs) / n

    req_ratio = request_mean("goodput/latency") / request_mean("least_inflight")
    # The ceiling (evaluate.bound): what the best fixed split of clients over backends, and the
    # bound no policy can pass, give on the same measure: the target is out of reach above the bound.
    ceilings = [ph.ceiling for r in runs for ph in r.phases if ph.ceiling is not None]
    ceiling = ""
    if len(ceilings) == len(l_phase):
        mean_li = sum(l_phase) / len(l_phase)
        split = sum(c.best_split_request_tok_s for c in ceilings) / len(ceilings) / mean_li
        bound = sum(c.bound_request_tok_s for c in ceilings) / len(ceilings) / mean_li
        ceiling = f"; best fixed split {split:.2f}x, no policy above {bound:.2f}x"

    def gain(ph: PhaseResult) -> float:
        return ph.policies["goodput/latency"].mean_request_tok_s / ph.policies["least_inflight"].mean_request_tok_s

    per_phase = [
        f"{r.name}/{ph.name}: {gain(ph):.2f}x"
        for r in runs
        for ph in r.phases
        if ph.policies["least_inflight"].mean_request_tok_s > 0
    ]
    return Target(
        name=name,
        holds=phase_ratio >= SPEEDUP,
        value=f"phase-mean {phase_ratio:.2f}x, request-weighted {req_ratio:.2f}x{ceiling}",
        detail=per_phase,
    )


def _aggregate_target(results: Sequence[ScenarioResult]) -> Target:
    name = f"goodput/latency aggregate tok/s >= {1 - AGGREGATE_SLACK:.2f} x least_inflight in every phase"
    worst: tuple[float, str] | None = None
    misses = []
    for res in results:
        for ph in res.phases:
            g, li = ph.policies.get("goodput/latency"), ph.policies.get("least_inflight")
            if g is None or li is None or li.aggregate_tok_s <= 0:
                continue
            r = g.aggregate_tok_s / li.aggregate_tok_s
            where = f"{res.name}/{ph.name}"
            if worst is None or r < worst[0]:
                worst = (r, where)
            if r < 1 - AGGREGATE_SLACK:
                misses.append(f"{where}: {r:.3f}")
    if worst is None:
        return Target(name=name, holds=None, value="not run")
    return Target(name=name, holds=not misses, value=f"min {worst[0]:.3f} ({worst[1]})", detail=misses)


def _recovery_target(by_name: dict[str, ScenarioResult]) -> list[Target]:
    res = by_name.get("degrade")
    out = []
    for obj, rec in res.recovery.items() if res else ():
        t = rec["recovery_s"]
        out.append(
            Target(
                name=f"goodput/{obj} back to {RATIO} x clairvoyant within {RECOVERY_S:.0f} s after the degrade drop",
                holds=t is not None and t <= RECOVERY_S,
                value="never" if t is None else f"{t:.0f} s",
                detail=[f"+{w:.0f}s: {r:.3f}" for w, r in rec["ratios"]],
            )
        )
    if not out:
        out.append(
            Target(
                name=f"back to {RATIO} x clairvoyant within {RECOVERY_S:.0f} s after the degrade drop",
                holds=None,
                value="not run",
            )
        )
    return out


def check_targets(results: Sequence[ScenarioResult]) -> list[Target]:
    by_name = {r.name: r for r in results}
    objectives = sorted({o for r in results for o in r.objectives})
    out = [_ratio_target(results, o) for o in objectives]
    if "latency" in objectives:
        out += [_speedup_target(by_name), _aggregate_target(results)]
    out += _recovery_target(by_name)
    return out
