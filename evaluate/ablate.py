"""Where the clairvoyant's lead comes from: goodput's rule fed some of the twin's truths.

The clairvoyant reference (`evaluate.oracle`) is goodput's decision rule with every estimate
replaced by the twin's truth. The gap between the two is learning quality, and this splits it:
each variant runs the same rule (no exploration, no optimism bonus, as the clairvoyant) with the
learned estimates except for the truths it names:

- `accept`: acceptance per cell (domain, temperature band, context band);
- `step`: the step time at a load, with the KV per request the engine's running requests hold
  now (the clairvoyant's);
- `step-avg-kv`: the true step-time curve at an average KV per request (a running mean over the
  run), so the live swings of KV are left out;
- `prefill`: prefill time per uncached token.

`python -m evaluate.ablate --scenario open-poisson --fleet 3xk26-ddtree:b=16,k26-dflash
--seed 0,1,2,3,4` prints, per phase, each variant's mean request tok/s and SLO goodput, beside the
shipped goodput policy and the clairvoyant. A diagnostic, not a contestant: `specroute eval`
does not run it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from backends import BackendSpec, Strategy
from evaluate.metrics import phase_metrics
from evaluate.oracle import OracleEstimates, OracleModel
from evaluate.runner import clairvoyant_rule, on_fleet
from evaluate.scenarios import SCENARIOS, Scenario
from evaluate.seeds import parse_seeds
from evaluate.sim import fleet_servers, simulate
from policies.base import Outcome
from policies.estimates import BackendEstimate, Estimates
from policies.goodput import Goodput
from twin.engine import Engine

__all__ = ["TRUTHS", "MixedEstimates", "MixedModel", "ablate"]

TRUTHS = ("accept", "step", "step-avg-kv", "prefill")
_KV_MEAN_WEIGHT = 0.002  # per sample of the engine's KV per running request: a mean over ~500 samples


class MixedModel:
    """A learned `BackendEstimate` whose answers to some questions come from the twin instead.

    Everything goodput reads or writes besides the four cost-model questions (sample counts,
    last choice, telemetry bookkeeping) is the learned estimate's: it keeps learning as usual."""

    learned: BackendEstimate
    truth: OracleModel
    truths: frozenset[str]
    kv_mean: float | None

    def __init__(self, learned: BackendEstimate, truth: OracleModel, truths: frozenset[str]) -> None:
        object.__setattr__(self, "learned", learned)
        object.__setattr__(self, "truth", truth)
        object.__setattr__(self, "truths", truths)
        object.__setattr__(self, "kv_mean", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.learned, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.learned, name, value)

    def accept_at(self, c: int) -> float:
        return (self.truth if "accept" in self.truths else self.learned).accept_at(c)

    def step_s(self, load: int) -> float:
        if "step" in self.truths:
            return self.truth.step_s(load)
        if "step-avg-kv" in self.truths:
            return self._step_at_mean_kv(load)
        return self.learned.step_s(load)

    def prefill_s(self, uncached: int, pairs: float = 0.0) -> float:
        return (self.truth if "prefill" in self.truths else self.learned).prefill_s(uncached, pairs)

    def prefill_stall_s(self, uncached: int, pairs: float = 0.0) -> float:
        return (self.truth if "prefill" in self.truths else self.learned).prefill_stall_s(uncached, pairs)

    def _step_at_mean_kv(self, load: int) -> float:
        engine: Engine = self.truth.engine
        st = engine.stats()
        mean = self.kv_mean
        if st.num_running:
            now = st.num_used_tokens / st.num_running
            mean = now if mean is None else mean + _KV_MEAN_WEIGHT * (now - mean)
            object.__setattr__(self, "kv_mean", mean)
        batch = max(1, min(load, engine.max_running))
        return engine.step_time(batch, kv_tokens=int(batch * (mean or 0.0)))


class MixedEstimates:
    """Stands in for `policies.estimates.Estimates`: learns as it does, answers with `MixedModel`."""

    def __init__(self, engines: dict[str, Engine], specs: Iterable[BackendSpec], truths: Iterable[str]) -> None:
        unknown = set(truths) - set(TRUTHS)
        if unknown:
            raise ValueError(f"unknown truth(s) {sorted(unknown)}, expected some of {list(TRUTHS)}")
        self.learned = Estimates()
        self.learned.register_all(specs)
        oracle = OracleEstimates(engines)
        wanted = frozenset(truths)
        self.backends: dict[str, MixedModel] = {}
        for name, est in self.learned.backends.items():
            assert isinstance(est, BackendEstimate)
            self.backends[name] = MixedModel(est, oracle.backends[name], wanted)
        self.used = 0
        self.skipped: dict[str, int] = {}

    def register(self, name: str, strategy: Strategy | str, max_running: int | None = None) -> MixedModel:
        return self.backends[name]

    def register_all(self, specs: Iterable[BackendSpec]) -> None:
        pass

    def stand_in(self, est: MixedModel) -> MixedModel:
        return est

    def observe(self, outcome: Outcome, copy: bool = False) -> bool:
        return self.learned.observe(outcome, copy)

    def describe(self) -> dict[str, dict[str, Any]]:
        return {}


def _variants(seed: int, truth_sets: Sequence[frozenset[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "goodput": lambda e, s: Goodput("latency", seed=seed, backends=s),
        "goodput, no exploration": lambda e, s: Goodput("latency", seed=seed, backends=s, epsilon=0.0, bonus=0.0),
    }
    for truths in truth_sets:
        label = "+".join(sorted(truths)) if truths else "none"
        out[f"truths: {label}"] = (lambda t: lambda e, s: clairvoyant_rule("latency", seed, MixedEstimates(e, s, t)))(
            truths
        )
    out["clairvoyant"] = lambda e, s: clairvoyant_rule("latency", seed, OracleEstimates(e))
    return out


def ablate(
    scenario: Scenario, seeds: Sequence[int], truth_sets: Sequence[frozenset[str]]
) -> dict[str, dict[str, tuple[float, float]]]:
    """Variant -> phase -> (mean request tok/s, SLO goodput req/s), averaged over `seeds`."""
    pool = [s.name for s in fleet_servers(scenario)]
    acc: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for seed in seeds:
        for key, factory in _variants(seed, truth_sets).items():
            run = simulate(scenario, factory, seed=seed)
            for ph, m in zip(scenario.phases, phase_metrics(run, scenario, pool), strict=True):
                acc.setdefault(key, {}).setdefault(ph.name, []).append((m.mean_request_tok_s, m.goodput_rps))
    return {
        key: {ph: (statistics.mean(v[0] for v in vals), statistics.mean(v[1] for v in vals)) for ph, vals in by.items()}
        for key, by in acc.items()
    }


def _truth_sets(text: str) -> list[frozenset[str]]:
    """`none,accept,step+prefill` -> [{}, {accept}, {step, prefill}]."""
    out = []
    for part in text.split(","):
        part = part.strip()
        names = frozenset() if part == "none" else frozenset(p for p in part.split("+") if p)
        unknown = names - set(TRUTHS)
        if unknown or not part:
            raise ValueError(f"truth set {part!r}: expected 'none' or names from {list(TRUTHS)} joined by '+'")
        out.append(names)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluate.ablate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="open-poisson", help=f"one of {', '.join(SCENARIOS)}")
    ap.add_argument("--fleet", default=None, help="run on this fleet (default: the scenario's pool)")
    ap.add_argument("--seed", type=parse_seeds, default=[0], help="seed or comma-separated seeds, averaged (default 0)")
    ap.add_argument(
        "--truths",
        default="none,accept,step,step-avg-kv,prefill,accept+step+prefill",
        help="comma-separated truth sets, each 'none' or names joined by '+' (default: each alone, and all)",
    )
    args = ap.parse_args(argv)
    try:
        scenario = SCENARIOS[args.scenario]
        if args.fleet:
            scenario = on_fleet(scenario, args.fleet)
        truth_sets = _truth_sets(args.truths)
    except KeyError:
        print(f"unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    seeds = args.seed
    res = ablate(scenario, seeds, truth_sets)
    reference = res["clairvoyant"]
    phases = [ph.name for ph in scenario.phases]
    print(f"{scenario.name} on {','.join(scenario.pool)}, seeds {','.join(map(str, seeds))}")
    print("mean request tok/s (x clairvoyant) | SLO goodput req/s, per phase")
    print(f"{'variant':34s}" + "".join(f"{p:>24s}" for p in phases))
    for key, by in res.items():
        cells = []
        for p in phases:
            tok, good = by[p]
            ref = reference[p][0]
            cells.append(f"{tok:7.1f} ({tok / ref if ref else 0.0:5.3f}) | {good:4.2f}")
        print(f"{key:34s}" + "".join(f"{c:>24s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
