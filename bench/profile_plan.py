"""`python -m bench.profile_plan`: does `specroute plan` pick the same fleet on fitted profiles as on the true ones?

For each set of server types (the K2.6 profiles; the Qwen3.6 ones; the K2.6 ones with DFlash's
replaced by a perturbed copy), `plan` runs on the true profiles and on the profiles
`bench.profile_fit` fitted from their twins (DIR/NAME.toml, NAME as the truth's), with the same
traffic, seeds and reference (so the phase rates are the same). Both plans score each fleet as
its mean over `--seeds` (consecutive; plan's default three, 0,1,2), every fleet on the same
arrivals on a seed. The fitted plan's pick is then scored on the true profiles: the true plan's
exhaustive search simulates every composition on the same seeds; a fleet that misses the SLO
parity (its mean worst phase more than 3 points below the most reliable fleet's) has no score.
The true pick is the best mean; the target is the same fleet, or one within 3% of its score.

    python -m bench.profile_plan --fitted out/bench-profile/quick [--truths out/bench-profile/truths]
                                 [--servers 4] [--traffic day] [--sample-s 60] [--sets k26,qwen36,k26-perturbed]
                                 [--seeds 0,1,2]

Prints both plans' picks, their scores on the true profiles and the ratio; exits 1 when a set
misses the target.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import msgspec

from evaluate.plan import PlanResult, plan
from evaluate.server_types import with_reference
from evaluate.traffic import load_traffic

TARGET = 0.03

# set -> (its server types, the reference a named traffic's loads are fractions of)
SETS: dict[str, tuple[tuple[str, ...], str]] = {
    "k26": (("k26-ar", "k26-dflash", "k26-ddtree", "k26-eagle3", "k26-ngram"), "k26-dflash"),
    "qwen36": (("qwen36-ar", "qwen36-ddtree-b15"), "qwen36-ddtree-b15"),
    "k26-perturbed": (("k26-ar", "k26-dflash-perturbed", "k26-ddtree", "k26-eagle3", "k26-ngram"), "k26-dflash"),
}
BUNDLED = Path(__file__).resolve().parent.parent / "twin" / "profiles"


class Comparison(msgspec.Struct, kw_only=True):
    set: str
    servers: int
    traffic: str
    true_pick: str
    true_score: float
    fitted_pick: str
    fitted_score_on_fitted: float
    fitted_pick_on_true: float | None  # None: the pick misses the SLO more often than the true plan admits
    wall_s: float

    @property
    def ratio(self) -> float:
        return (self.fitted_pick_on_true or 0.0) / self.true_score if self.true_score > 0 else 0.0

    @property
    def met(self) -> bool:
        return self.true_pick == self.fitted_pick or self.ratio >= 1 - TARGET


def _truth_path(name: str, truths: Path) -> Path:
    own = truths / f"{name}.toml"
    return own if own.is_file() else BUNDLED / f"{name}.toml"


def _names(fleet: str, directory: Path) -> str:
    """A fleet label with each profile path as its bare name: the true and fitted labels compare."""
    return fleet.replace(f"{directory}/", "").replace(".toml", "")


def compare(
    name: str,
    fitted: Path,
    truths: Path,
    servers: int,
    traffic_name: str,
    sample_s: float,
    jobs: int | None,
    seeds: tuple[int, ...] = (0, 1, 2),
) -> Comparison | None:
    types, reference = SETS[name]
    fit_paths = [fitted / f"{t}.toml" for t in types]
    missing = [str(p) for p in fit_paths if not p.is_file()]
    if missing:
        print(f"{name}: skipped, no fitted profile {', '.join(missing)}", flush=True)
        return None
    true_paths = [_truth_path(t, truths) for t in types]
    ref = str(_truth_path(reference, truths))
    traffic = load_traffic(traffic_name)
    t0 = time.perf_counter()

    def run(paths: list[Path], exhaustive: bool) -> PlanResult:
        strs = [str(p) for p in paths]
        scenario = with_reference(traffic.scenario, strs, ref)
        return plan(
            servers,
            msgspec.structs.replace(traffic, scenario=scenario),
            types=strs,
            sample_s=sample_s,
            seed=seeds[0],
            seeds=len(seeds),
            exhaustive=exhaustive,
            jobs=jobs,
        )

    print(f"{name}: plan for {servers} servers on the fitted profiles ...", flush=True)
    on_fit = run(fit_paths, False)
    fit_pick = _names(on_fit.ranked[0].fleet, fitted)
    print(f"{name}: plan on the true profiles (every composition simulated), seeds {seeds} ...", flush=True)
    on_true = run(true_paths, True)
    assert on_true.exhaustive is not None
    # each fleet's mean over the seeds; none for a fleet that misses the SLO parity
    scores = {_names(_names(k, truths), BUNDLED): v for k, v in on_true.exhaustive.scores.items()}
    true_pick = max(scores, key=lambda k: scores[k])
    return Comparison(
        set=name,
        servers=servers,
        traffic=traffic_name,
        true_pick=true_pick,
        true_score=round(scores[true_pick], 3),
        fitted_pick=fit_pick,
        fitted_score_on_fitted=round(on_fit.ranked[0].score, 3),
        fitted_pick_on_true=round(scores[fit_pick], 3) if fit_pick in scores else None,
        wall_s=round(time.perf_counter() - t0, 1),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fitted", type=Path, default=Path("out/bench-profile/quick"))
    ap.add_argument("--truths", type=Path, default=Path("out/bench-profile/truths"))
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--traffic", default="day")
    ap.add_argument("--sample-s", type=float, default=60.0)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument(
        "--seeds", default="0,1,2", help="consecutive seeds every fleet's score is a mean over (both plans)"
    )
    ap.add_argument("--output", type=Path, default=None, help="write the comparisons as JSON here")
    args = ap.parse_args(argv)
    seeds = tuple(int(x) for x in args.seeds.split(","))
    if list(seeds) != list(range(seeds[0], seeds[0] + len(seeds))):
        ap.error(f"--seeds: consecutive seeds, e.g. 0,1,2 (got {args.seeds})")
    unknown = [s for s in args.sets.split(",") if s and s not in SETS]
    if unknown:
        ap.error(f"--sets: unknown {', '.join(unknown)} (known: {', '.join(SETS)})")
    rows = [
        c
        for s in args.sets.split(",")
        if s
        and (c := compare(s, args.fitted, args.truths, args.servers, args.traffic, args.sample_s, args.jobs, seeds))
        is not None
    ]
    if args.output:
        args.output.write_bytes(msgspec.json.format(msgspec.json.encode(rows), indent=1) + b"\n")
    print(
        f"\nplan for {args.servers} servers, traffic {args.traffic!r}, {args.sample_s:g} s per phase, "
        f"scores on the true profiles a mean over seeds {args.seeds}"
    )
    print("| set | pick on the true profiles | score | pick on the fitted | its score on the true | ratio | wall s |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        on_true = f"{r.fitted_pick_on_true:.2f}" if r.fitted_pick_on_true is not None else "misses the SLO"
        print(
            f"| {r.set} | {r.true_pick} | {r.true_score:.2f} | {r.fitted_pick} | {on_true} | "
            f"{r.ratio:.3f} | {r.wall_s:.0f} |"
        )
    failed = [f"{r.set}: {r.fitted_pick} scores {r.ratio:.3f} of {r.true_pick}" for r in rows if not r.met]
    if not rows:
        failed.append("no set had all its fitted profiles")
    print("targets: " + ("all met" if not failed else "MISSED: " + "; ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
