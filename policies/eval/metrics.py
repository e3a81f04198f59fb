"""What a run measured, per phase and per time window, with the load generator's definitions.

- aggregate tok/s: tokens emitted during the phase / phase duration (tokens are counted when the
  engine step that produced them ends, so a phase is charged exactly for its own work);
- request tok/s: decode tok/s of one request = (tokens - 1) / (last - first token time), as in
  DESIGN.md; its mean and median over the requests that finished in the phase;
- TTFT p99 over the requests that finished in the phase (queueing shows up here);
- backend share: fraction of the requests *sent* during the phase that went to each backend.

Every phase but the first is measured from `SETTLE_S` after its start: in a closed loop the
requests of the previous phase drain during the first seconds of the next one (at a drop from 8
to 1 client, seven requests finish in the first seconds of the 1-client phase and would count
for ~10% of its tokens), and how much is left to drain depends on the previous phase's routing,
not on this one's. The first phase is measured from t=0: its cold start is part of the result.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import msgspec

from common.percentile import percentile
from policies.eval.scenarios import Scenario
from policies.eval.sim import RunResult

__all__ = ["SETTLE_S", "PhaseMetrics", "metric_of", "phase_metrics", "window_series"]

SETTLE_S = 10.0


class PhaseMetrics(msgspec.Struct, kw_only=True):
    aggregate_tok_s: float
    mean_request_tok_s: float
    p50_request_tok_s: float
    p99_ttft_ms: float
    backend_share: dict[str, float]
    requests: int
    clairvoyant_ratio: float | None = None
    clairvoyant_ratios: dict[str, float] = {}


def metric_of(m: PhaseMetrics, objective: str) -> float:
    """The figure an objective is judged on: mean request tok/s (latency) or aggregate (throughput)."""
    return m.mean_request_tok_s if objective == "latency" else m.aggregate_tok_s


def phase_metrics(run: RunResult, scenario: Scenario, pool: Sequence[str],
                  settle_s: float = SETTLE_S) -> list[PhaseMetrics]:
    starts: list[float] = []  # measured window of each phase: [start, end)
    ends: list[float] = []
    t = 0.0
    for i, ph in enumerate(scenario.phases):
        starts.append(t + (min(settle_s, ph.duration_s / 2) if i else 0.0))
        t += ph.duration_s
        ends.append(t)
    n = len(ends)

    def index(when: float) -> int | None:
        """Phase whose measured window holds `when`, or None in a settling stretch."""
        i = min(bisect.bisect_right(ends, when), n - 1)
        return i if when >= starts[i] else None

    tokens = [0] * n
    for when, k in run.tokens_at:
        i = index(when)
        if i is not None:
            tokens[i] += k
    rates: list[list[float]] = [[] for _ in range(n)]
    ttfts: list[list[float]] = [[] for _ in range(n)]
    sent: list[dict[str, int]] = [{name: 0 for name in pool} for _ in range(n)]
    for r in run.records:
        i = index(r.t_last)
        if i is not None:
            tps = r.decode_tok_s
            if tps is not None:
                rates[i].append(tps)
            ttfts[i].append((r.t_first - r.t_send) * 1000.0)
        j = min(bisect.bisect_right(ends, r.t_send), n - 1)
        sent[j][r.backend] = sent[j].get(r.backend, 0) + 1
    out = []
    for i in range(n):
        total = sum(sent[i].values())
        span = ends[i] - starts[i]
        out.append(PhaseMetrics(
            aggregate_tok_s=tokens[i] / span if span > 0 else 0.0,
            mean_request_tok_s=sum(rates[i]) / len(rates[i]) if rates[i] else 0.0,
            p50_request_tok_s=percentile(rates[i], 50) or 0.0,  # 0 for a phase with no requests
            p99_ttft_ms=percentile(ttfts[i], 99) or 0.0,
            backend_share={k: (v / total if total else 0.0) for k, v in sent[i].items()},
            requests=len(rates[i]),
        ))
    return out


def window_series(run: RunResult, start_s: float, end_s: float, width_s: float, step_s: float,
                  objective: str) -> list[tuple[float, float]]:
    """(window start, objective metric) over sliding windows [t, t + width) from start_s."""
    out = []
    t = start_s
    while t + width_s <= end_s + 1e-9:
        if objective == "latency":
            vals = [r.decode_tok_s for r in run.records if t <= r.t_last < t + width_s]
            vals = [v for v in vals if v is not None]
            out.append((t, sum(vals) / len(vals) if vals else 0.0))
        else:
            k = sum(n for when, n in run.tokens_at if t <= when < t + width_s)
            out.append((t, k / width_s))
        t += step_s
    return out
