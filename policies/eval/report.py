"""Printed tables and `eval.json`.

`eval.json` layout (all figures per phase, per contestant):

    {"seed": 0, "objectives": ["latency", "throughput"], "primary_objective": "latency",
     "scenarios": {"ramp": {"description": ..., "pool": [...], "wall_s": ...,
        "phases": {"00-c1": {"concurrency": 1, "duration_s": 60.0, "domains": {...},
            "policies": {"goodput/latency": {"aggregate_tok_s": ..., "mean_request_tok_s": ...,
                "p50_request_tok_s": ..., "p99_ttft_ms": ..., "backend_share": {...},
                "requests": ..., "clairvoyant_ratio": ..., "clairvoyant_ratios": {...}}, ...},
            "ceiling": {"best_split_request_tok_s": ..., "best_split": {...},
                "bound_request_tok_s": ...}}},
        "summary": {...}, "recovery": {...}}},
     "targets": [{"name": ..., "holds": true, "value": ..., "detail": [...]}]}

Contestants: `least_inflight`, `round_robin`, `threshold`, `goodput/<objective>`,
`clairvoyant/<objective>`, `static/<backend>`. `clairvoyant_ratio` is on the contestant's own
objective's metric (mean request tok/s for latency, aggregate tok/s for throughput); for
contestants without an objective, on the primary objective; `clairvoyant_ratios` has both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, TextIO

import msgspec

from policies.eval.runner import ScenarioResult
from policies.eval.targets import Target

__all__ = ["markdown", "print_scenario", "print_targets", "to_json", "write_json"]


def _short(name: str) -> str:
    return (name.replace("clairvoyant/", "clairv/").replace("goodput/", "goodput/")
            .replace("static/", "only:"))


def print_scenario(res: ScenarioResult, out: TextIO) -> None:
    out.write(f"\n== {res.name}: {res.description} (pool {', '.join(res.pool)}; {res.wall_s:.1f} s)\n")
    backends = res.pool
    header = (f"{'phase':14s} {'contestant':22s} {'agg tok/s':>9s} {'req mean':>8s} {'req p50':>8s} "
              f"{'ttft p99 ms':>11s} {'vs clairv':>9s}  share " + " ".join(f"{b[-7:]:>7s}" for b in backends))
    out.write(header + "\n")
    for ph in res.phases:
        label = f"{ph.name} C={ph.concurrency}"
        for key, m in ph.policies.items():
            shares = " ".join(f"{m.backend_share.get(b, 0.0):7.2f}" for b in backends)
            ratio = f"{m.clairvoyant_ratio:9.3f}" if m.clairvoyant_ratio is not None else " " * 9
            out.write(f"{label:14.14s} {_short(key):22.22s} {m.aggregate_tok_s:9.1f} "
                      f"{m.mean_request_tok_s:8.1f} {m.p50_request_tok_s:8.1f} "
                      f"{m.p99_ttft_ms:11.0f} {ratio}        {shares}\n")
            label = ""
        if ph.ceiling is not None:
            c = ph.ceiling
            split = ", ".join(f"{b} {n}" for b, n in c.best_split.items())
            out.write(f"{'':14s} {'ceiling (eval.bound)':22s} best fixed split {c.best_split_request_tok_s:.1f} "
                      f"req tok/s ({split}); no policy above {c.bound_request_tok_s:.1f}\n")
    for obj, rec in res.recovery.items():
        t = rec["recovery_s"]
        out.write(f"recovery after the drop ({obj}): {'never' if t is None else f'{t:.0f} s'}; "
                  f"{rec['window_s']:.0f} s windows: "
                  + " ".join(f"+{w:.0f}:{r:.2f}" for w, r in rec["ratios"]) + "\n")


def print_targets(targets: Sequence[Target], out: TextIO) -> None:
    out.write("\n== targets\n")
    for t in targets:
        mark = {True: "HOLDS", False: "FAILS", None: "n/a  "}[t.holds]
        out.write(f"{mark}  {t.name}: {t.value}\n")
        if t.holds is False:
            for line in t.detail[:12]:
                out.write(f"         {line}\n")


def to_json(results: Sequence[ScenarioResult], targets: Sequence[Target], *, seed: int,
            objectives: Sequence[str], primary: str) -> dict:
    scenarios = {}
    for res in results:
        scenarios[res.name] = {
            "description": res.description,
            "pool": res.pool,
            "wall_s": round(res.wall_s, 3),
            "phases": {ph.name: {"concurrency": ph.concurrency, "duration_s": ph.duration_s,
                                 "domains": ph.domains,
                                 "policies": msgspec.to_builtins(ph.policies),
                                 "ceiling": msgspec.to_builtins(ph.ceiling)}
                       for ph in res.phases},
            "summary": res.summary,
            "recovery": res.recovery,
        }
    return {"seed": seed, "objectives": list(objectives), "primary_objective": primary,
            "scenarios": scenarios, "targets": msgspec.to_builtins(list(targets))}


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=1))


def _f(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def markdown(results: Sequence[ScenarioResult], targets: Sequence[Target], *, seed: int) -> str:
    """A compact summary (`DIR/eval.md`) for the README: per phase, least_inflight against goodput
    and clairvoyant, on both metrics; then the targets."""
    objectives = results[0].objectives if results else []
    cols = ["least_inflight"] + [f"{k}/{o}" for o in objectives for k in ("goodput", "clairvoyant")]
    names = ["LI"] + [f"{'GP' if k == 'goodput' else 'CV'}-{o[:3]}" for o in objectives
                      for k in ("goodput", "clairvoyant")]
    lines = [f"Evaluation on the virtual clock (`specroute eval --scenario all --seed {seed}`). "
             "LI = least_inflight, GP = goodput, CV = clairvoyant; lat/thr = objective. "
             "Request tok/s = mean single-request decode tok/s; ratio = goodput / clairvoyant on the "
             "objective's metric.", ""]
    head = (["scenario", "phase", "C"] + [f"agg {n}" for n in names] + [f"req {n}" for n in names]
            + [f"ratio GP-{o[:3]}" for o in objectives])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for res in results:
        for ph in res.phases:
            p = ph.policies
            row = [res.name, ph.name, str(ph.concurrency)]
            row += [_f(p[c].aggregate_tok_s) if c in p else "" for c in cols]
            row += [_f(p[c].mean_request_tok_s) if c in p else "" for c in cols]
            row += [f"{p[f'goodput/{o}'].clairvoyant_ratio:.3f}" for o in objectives]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| target | holds | value |", "|---|---|---|"]
    for t in targets:
        lines.append(f"| {t.name} | {({True: 'yes', False: 'no', None: 'n/a'})[t.holds]} | {t.value} |")
    return "\n".join(lines) + "\n"
