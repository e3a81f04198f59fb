"""One scenario over several seeds, reported as one result.

A 90-120 s phase holds tens to hundreds of requests, and at overload the order in which a few
40-65k-token prompts arrive decides which server clogs: one seed can put a policy 10% ahead of
another, the next seed 5% behind. `specroute eval --seed 0,1,2,3,4` runs each seed as
`run_scenario` does (every contestant on the same requests), in worker processes, and merges:

- per phase and contestant, every rate, percentile and ratio is the mean over the seeds (a
  percentile is the mean of the seeds' percentiles, a clairvoyant ratio the mean of the ratios);
  counts (`requests`, `arrived`, `shed`, `unfinished`) are totals over the seeds;
- the scenario summary and the cold-start figures are means over the seeds;
- `recovery` (the degrade scenario) and the ceilings are the first seed's.

Targets (`evaluate.targets`, `evaluate.fleet_targets`) then judge the merged result like
a single run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import msgspec

from evaluate.metrics import PhaseMetrics
from evaluate.processes import map_in_processes
from evaluate.runner import ScenarioResult, run_scenario
from evaluate.scenarios import Scenario

__all__ = ["merge_results", "parse_seeds", "run_seeds"]

_COUNTS = frozenset({"requests", "arrived", "shed", "unfinished"})


def parse_seeds(text: str) -> list[int]:
    """`0,1,2` -> [0, 1, 2] (an argparse type: a bad or repeated seed is an ArgumentTypeError)."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer or comma-separated integers") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: a seed is repeated")
    return seeds


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _merge_shares(shares: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for s in shares for k in s)
    return {k: _mean([s.get(k, 0.0) for s in shares]) for k in keys}


def _merge_ratios(ratios: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in ratios[0] if all(k in r for r in ratios)]
    return {k: _mean([r[k] for r in ratios]) for k in keys}


def _merge_metrics(ms: Sequence[PhaseMetrics]) -> PhaseMetrics:
    fields: dict[str, Any] = {}
    for name in PhaseMetrics.__struct_fields__:
        values = [getattr(m, name) for m in ms]
        if name == "backend_share":
            fields[name] = _merge_shares(values)
        elif name == "clairvoyant_ratios":
            fields[name] = _merge_ratios(values)
        elif name in _COUNTS:
            fields[name] = sum(values)
        elif any(v is None for v in values):
            fields[name] = None  # a ratio that some seed could not form
        else:
            fields[name] = _mean(values)
    return PhaseMetrics(**fields)


def _merge_floats(
    dicts: Sequence[dict[str, dict[str, float]]], digits: int | None = None
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key in dicts[0]:
        rows = [d[key] for d in dicts if key in d]
        means = {f: _mean([r[f] for r in rows if f in r]) for f in rows[0]}
        out[key] = means if digits is None else {f: round(v, digits) for f, v in means.items()}
    return out


def merge_results(results: Sequence[ScenarioResult]) -> ScenarioResult:
    """The results of one scenario on several seeds (same contestants, same phases) as one."""
    if not results:
        raise ValueError("merge_results needs at least one result")
    first = results[0]
    if len(results) == 1:
        return first
    shape = [(ph.name, ph.policies.keys()) for ph in first.phases]
    if any([(ph.name, ph.policies.keys()) for ph in r.phases] != shape for r in results):
        raise ValueError("merge_results: the results differ in phases or contestants")
    phases = []
    for i, ph in enumerate(first.phases):
        policies = {k: _merge_metrics([r.phases[i].policies[k] for r in results]) for k in ph.policies}
        phases.append(
            msgspec.structs.replace(ph, policies=policies, rate_rps=_mean([r.phases[i].rate_rps for r in results]))
        )
    return msgspec.structs.replace(
        first,
        phases=phases,
        summary=_merge_floats([r.summary for r in results]),
        cold_start=_merge_floats([r.cold_start for r in results], digits=4),  # as runner rounds them
        wall_s=sum(r.wall_s for r in results),
    )


def _run_one(job: tuple[Scenario, int, dict[str, Any]]) -> ScenarioResult:
    scenario, seed, kwargs = job
    return run_scenario(scenario, seed=seed, **kwargs)


def run_seeds(scenario: Scenario, seeds: Sequence[int], jobs: int | None = None, **kwargs: Any) -> ScenarioResult:
    """`run_scenario` once per seed (in up to `jobs` processes, default the CPU count), merged."""
    if not seeds:
        raise ValueError("run_seeds needs at least one seed")
    work = [(scenario, s, kwargs) for s in seeds]
    return merge_results(map_in_processes(_run_one, work, jobs or os.cpu_count() or 1))
