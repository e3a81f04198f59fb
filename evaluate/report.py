"""Printed tables and `eval.json`.

`eval.json` layout (all figures per phase, per contestant):

    {"seed": 0, "seeds": [0], "objectives": ["latency", "throughput"], "primary_objective": "latency",
     "slo": {"ttft_s": 5.0, "tpot_s": 0.06},
     "scenarios": {"ramp": {"description": ..., "fleet": "k26-ar,k26-ddtree,...", "pool": [...],
        "wall_s": ...,
        "phases": {"00-c1": {"concurrency": 1, "arrival": "closed", "load": 0.0, "rate_rps": 0.0,
            "duration_s": 60.0, "domains": {...},
            "policies": {"goodput/latency": {"aggregate_tok_s": ..., "mean_request_tok_s": ...,
                "p50_request_tok_s": ..., "p50_ttft_ms": ..., "p99_ttft_ms": ..., "p50_tpot_ms": ...,
                "p99_tpot_ms": ..., "p50_e2e_s": ..., "p99_e2e_s": ..., "arrived": ..., "shed": ...,
                "unfinished": ..., "slo_attainment": ..., "goodput_rps": ..., "cached_share": ...,
                "backend_share": {...}, "requests": ..., "clairvoyant_ratio": ...,
                "clairvoyant_ratios": {...}, "regret": ...}, ...},
            "ceiling": {"best_split_request_tok_s": ..., "best_split": {...},
                "bound_request_tok_s": ...} or null}},
        "summary": {...}, "recovery": {...}, "cold_start": {...}}},
     "fleets": {...} (with several --fleet: per scenario, per fleet, per phase, per contestant),
     "targets": [{"name": ..., "holds": true, "value": ..., "detail": [...]}]}

A scenario run on several fleets is keyed `SCENARIO@FLEET` in "scenarios".

Contestants: `least_inflight`, `round_robin`, `threshold`, `goodput/<objective>`,
`clairvoyant/<objective>`, `clairvoyant/e2e` (open loop), `sglang/<policy>`, `static/<member>`.
`clairvoyant_ratio` is on the contestant's own objective's metric (mean request tok/s for
latency, aggregate tok/s for throughput); for contestants without an objective, on the primary
objective; `clairvoyant_ratios` has both. `regret`: 1 - mean request tok/s / the best static's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec

from evaluate.runner import ScenarioResult
from evaluate.targets import Target

__all__ = ["markdown", "print_scenario", "print_targets", "to_json", "write_json"]


def _short(name: str) -> str:
    return name.replace("clairvoyant/", "clairv/").replace("static/", "only:").replace("sglang/", "sgl/")


def print_scenario(res: ScenarioResult, out: TextIO) -> None:
    out.write(f"\n== {res.name}: {res.description} (fleet {res.fleet}; SLO {res.slo.label}; {res.wall_s:.1f} s)\n")
    backends = res.pool
    header = (
        f"{'phase':16s} {'contestant':20s} {'agg tok/s':>9s} {'req mean':>8s} {'ttft p50':>8s} "
        f"{'p99 ms':>7s} {'tpot p50':>8s} {'p99 ms':>6s} {'e2e p50':>7s} {'p99 s':>6s} {'SLO':>5s} "
        f"{'good/s':>6s} {'shed':>4s} {'cache':>5s} {'vs CV':>6s}  share " + " ".join(f"{b[-7:]:>7s}" for b in backends)
    )
    out.write(header + "\n")
    for ph in res.phases:
        label = f"{ph.name} {ph.rate_rps:.2f}/s" if ph.arrival != "closed" else f"{ph.name} C={ph.concurrency}"
        for key, m in ph.policies.items():
            shares = " ".join(f"{m.backend_share.get(b, 0.0):7.2f}" for b in backends)
            ratio = f"{m.clairvoyant_ratio:6.3f}" if m.clairvoyant_ratio is not None else " " * 6
            out.write(
                f"{label:16.16s} {_short(key):20.20s} {m.aggregate_tok_s:9.1f} {m.mean_request_tok_s:8.1f} "
                f"{m.p50_ttft_ms:8.0f} {m.p99_ttft_ms:7.0f} {m.p50_tpot_ms:8.1f} {m.p99_tpot_ms:6.1f} "
                f"{m.p50_e2e_s:7.1f} {m.p99_e2e_s:6.1f} {m.slo_attainment:5.2f} {m.goodput_rps:6.2f} "
                f"{m.shed:4d} {m.cached_share:5.2f} {ratio}  {shares}\n"
            )
            label = ""
        if ph.ceiling is not None:
            c = ph.ceiling
            split = ", ".join(f"{b} {n}" for b, n in c.best_split.items())
            out.write(
                f"{'':16s} {'ceiling (eval.bound)':20s} best fixed split {c.best_split_request_tok_s:.1f} "
                f"req tok/s ({split}); no policy above {c.bound_request_tok_s:.1f}\n"
            )
    for obj, rec in res.recovery.items():
        t = rec["recovery_s"]
        out.write(
            f"recovery after the drop ({obj}): {'never' if t is None else f'{t:.0f} s'}; "
            f"{rec['window_s']:.0f} s windows: " + " ".join(f"+{w:.0f}:{r:.2f}" for w, r in rec["ratios"]) + "\n"
        )
    for key, cold in res.cold_start.items():
        out.write(
            f"cold start ({key}): first {cold['window_s']:.0f} s {cold['request_tok_s']:.1f} req tok/s vs "
            f"clairvoyant {cold['reference_tok_s']:.1f} (regret {100 * cold['regret']:.1f}%)\n"
        )


def print_targets(targets: Sequence[Target], out: TextIO) -> None:
    out.write("\n== targets\n")
    for t in targets:
        mark = {True: "HOLDS", False: "FAILS", None: "n/a  "}[t.holds]
        out.write(f"{mark}  {t.name}: {t.value}\n")
        if t.holds is False:
            for line in t.detail[:12]:
                out.write(f"         {line}\n")


def scenario_json(res: ScenarioResult) -> dict[str, Any]:
    return {
        "description": res.description,
        "fleet": res.fleet,
        "pool": res.pool,
        "wall_s": round(res.wall_s, 3),
        "phases": {
            ph.name: {
                "concurrency": ph.concurrency,
                "arrival": ph.arrival,
                "load": ph.load,
                "rate_rps": round(ph.rate_rps, 4),
                "duration_s": ph.duration_s,
                "domains": ph.domains,
                "policies": msgspec.to_builtins(ph.policies),
                "ceiling": msgspec.to_builtins(ph.ceiling),
            }
            for ph in res.phases
        },
        "summary": res.summary,
        "recovery": res.recovery,
        "cold_start": res.cold_start,
    }


def to_json(
    results: Sequence[ScenarioResult],
    targets: Sequence[Target],
    *,
    seeds: Sequence[int],
    objectives: Sequence[str],
    primary: str,
    fleets: dict[str, Any] | None = None,
) -> dict[str, Any]:
    scenarios = {}
    for res in results:
        scenarios[res.name] = scenario_json(res)
    slo = results[0].slo if results else None
    doc = {
        "seed": seeds[0],  # the first (or only) seed; with several, figures are means over `seeds`
        "seeds": list(seeds),
        "objectives": list(objectives),
        "primary_objective": primary,
        "slo": msgspec.to_builtins(slo),
        "scenarios": scenarios,
        "targets": msgspec.to_builtins(list(targets)),
    }
    if fleets:
        doc["fleets"] = fleets
    return doc


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=1))


def _f(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _closed_table(results: Sequence[ScenarioResult], seed: str) -> list[str]:
    objectives = results[0].objectives
    cols = ["least_inflight"] + [f"{k}/{o}" for o in objectives for k in ("goodput", "clairvoyant")]
    names = ["LI"] + [
        f"{'GP' if k == 'goodput' else 'CV'}-{o[:3]}" for o in objectives for k in ("goodput", "clairvoyant")
    ]
    lines = [
        f"Closed loop on the virtual clock (`specroute eval --seed {seed}`). "
        "LI = least_inflight, GP = goodput, CV = clairvoyant; lat/thr = objective. "
        "Request tok/s = mean single-request decode tok/s; ratio = goodput / clairvoyant on the "
        "objective's metric.",
        "",
    ]
    head = (
        ["scenario", "phase", "C"]
        + [f"agg {n}" for n in names]
        + [f"req {n}" for n in names]
        + [f"ratio GP-{o[:3]}" for o in objectives]
    )
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for res in results:
        for ph in res.phases:
            p = ph.policies
            row = [res.name, ph.name, str(ph.concurrency)]
            row += [_f(p[c].aggregate_tok_s) if c in p else "" for c in cols]
            row += [_f(p[c].mean_request_tok_s) if c in p else "" for c in cols]
            row += [f"{p[f'goodput/{o}'].clairvoyant_ratio:.3f}" if f"goodput/{o}" in p else "" for o in objectives]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def _best_peer(policies: dict[str, Any]) -> str | None:
    peers = [k for k in policies if k.startswith("sglang/")]
    return max(peers, key=lambda k: policies[k].mean_request_tok_s) if peers else None


def _best_static(policies: dict[str, Any]) -> str | None:
    statics = [k for k in policies if k.startswith("static/")]
    return max(statics, key=lambda k: policies[k].mean_request_tok_s) if statics else None


def _open_table(results: Sequence[ScenarioResult], seed: str) -> list[str]:
    """Policy vs peer baselines with SLO goodput, per open-loop phase."""
    slo = results[0].slo
    lines = [
        f"Open loop on the virtual clock (`specroute eval --seed {seed}`), SLO {slo.label} (seconds). "
        "Per phase: goodput/latency, the best SGLang-router policy of that phase (by mean request "
        "tok/s), least_inflight, the best static backend (alone with a 1/N share of the arrivals) and "
        "the clairvoyant references. req = mean request tok/s; SLO = attainment (shed and unfinished "
        "count as misses); good/s = requests/s meeting the SLO.",
        "",
    ]
    head = [
        "scenario",
        "phase",
        "req/s",
        "contestant",
        "req tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p99 ms",
        "e2e p99 s",
        "SLO",
        "good/s",
        "shed",
        "cached",
    ]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for res in results:
        for ph in res.phases:
            p = ph.policies
            keys = [
                "goodput/latency",
                _best_peer(p),
                "least_inflight",
                _best_static(p),
                "clairvoyant/latency",
                "clairvoyant/e2e",
            ]
            first = True
            for k in keys:
                if k is None or k not in p:
                    continue
                m = p[k]
                lead = [res.name, ph.name, f"{ph.rate_rps:.2f}"] if first else ["", "", ""]
                first = False
                cells = [
                    *lead,
                    k,
                    _f(m.mean_request_tok_s),
                    f"{m.p50_ttft_ms:.0f}",
                    f"{m.p99_ttft_ms:.0f}",
                    f"{m.p99_tpot_ms:.0f}",
                    f"{m.p99_e2e_s:.1f}",
                    f"{m.slo_attainment:.2f}",
                    f"{m.goodput_rps:.2f}",
                    str(m.shed),
                    f"{m.cached_share:.2f}",
                ]
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(
    results: Sequence[ScenarioResult],
    targets: Sequence[Target],
    *,
    seeds: Sequence[int],
    extra: Sequence[str] = (),
) -> str:
    """A compact summary (`DIR/eval.md`) for docs/evaluation.md: the closed-loop table (least_inflight
    against goodput and clairvoyant), the open-loop table (policy vs peer baselines, SLO goodput),
    any extra tables (fleet vs fleet), then the targets. With several seeds the figures are means
    over them."""
    seed = ",".join(str(s) for s in seeds)
    closed = [r for r in results if all(ph.arrival == "closed" for ph in r.phases)]
    opened = [r for r in results if r not in closed]
    lines: list[str] = []
    if closed:
        lines += [*_closed_table(closed, seed), ""]
    if opened:
        lines += [*_open_table(opened, seed), ""]
    lines += list(extra)
    lines += ["", "| target | holds | value |", "|---|---|---|"]
    for t in targets:
        lines.append(f"| {t.name} | {({True: 'yes', False: 'no', None: 'n/a'})[t.holds]} | {t.value} |")
    return "\n".join(lines) + "\n"
