"""What a run measured, per phase and per time window, with the load generator's definitions.

- aggregate tok/s: tokens emitted during the phase / phase duration (tokens are counted when the
  engine step that produced them ends, so a phase is charged exactly for its own work);
- request tok/s: decode tok/s of one request = (tokens - 1) / (last - first token time), as in
  `docs/metrics.md`; its mean and median over the requests that finished in the phase;
- TTFT p99 over the requests that finished in the phase (queueing shows up here);
- backend share: fraction of the requests *sent* during the phase that went to each backend;
- latency percentiles (p50/p99) of TTFT, TPOT (time per output token after the first) and e2e,
  SLO attainment and goodput (`evaluate.slo`), and the requests shed (503 twice) or left
  unfinished, which count as SLO misses and never as speed;
- cached share: prompt tokens served by the servers' prefix caches / all prompt tokens.

Which requests a phase is judged on: in a closed-loop phase those that *finished* in its measured
window (the population defines the phase, as in the closed loop); in an open-loop phase those that
*arrived* in it, wherever they finished (the run drains after the last phase), since an arrival's
fate is what the phase's load did to it.

Every phase but the first is measured from `SETTLE_S` after its start: in a closed loop the
requests of the previous phase drain during the first seconds of the next one (at a drop from 8
to 1 client, seven requests finish in the first seconds of the 1-client phase and would count
for ~10% of its tokens), and how much is left to drain depends on the previous phase's routing,
not on this one's. The first phase is measured from t=0: its cold start is part of the result.
An open-loop phase starts from a drained fleet (`evaluate.sim`) and is measured from
`OPEN_SETTLE_S` after its start (a quarter of it at most), once its queues have filled to their
steady state; the cold start of the run is reported on its own (`ScenarioResult.cold_start`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import msgspec

from common.percentile import percentile
from evaluate.scenarios import Scenario
from evaluate.sim import RequestRecord, RunResult
from evaluate.slo import DEFAULT_SLO, SLO

__all__ = ["SETTLE_S", "PhaseMetrics", "metric_of", "phase_metrics", "pooled_phase_metrics", "window_series"]

SETTLE_S = 10.0
OPEN_SETTLE_S = 30.0  # an open-loop phase starts from a drained fleet: skip its fill-up


class PhaseMetrics(msgspec.Struct, kw_only=True):
    aggregate_tok_s: float
    mean_request_tok_s: float
    p50_request_tok_s: float
    p99_ttft_ms: float
    backend_share: dict[str, float]
    requests: int
    clairvoyant_ratio: float | None = None
    clairvoyant_ratios: dict[str, float] = {}
    p50_ttft_ms: float = 0.0
    p50_tpot_ms: float = 0.0
    p99_tpot_ms: float = 0.0
    p50_e2e_s: float = 0.0
    p99_e2e_s: float = 0.0
    arrived: int = 0  # requests the phase is judged on (completed + shed + unfinished)
    shed: int = 0
    unfinished: int = 0
    slo_attainment: float = 0.0
    goodput_rps: float = 0.0
    cached_share: float = 0.0
    regret: float | None = None  # vs the best static backend of this phase, on the primary metric
    # mean request tok/s over every arrived request, one that missed the SLO counting 0: speed that
    # does not come from starving some requests (a queue can keep batches small) or from shedding
    slo_request_tok_s: float = 0.0


def metric_of(m: PhaseMetrics, objective: str) -> float:
    """The figure an objective is judged on: mean request tok/s (latency) or aggregate (throughput)."""
    return m.mean_request_tok_s if objective == "latency" else m.aggregate_tok_s


def _pct(values: Sequence[float], q: float, scale: float = 1.0) -> float:
    v = percentile(values, q)
    return v * scale if v is not None else 0.0  # 0 for a phase with no requests


class _Judged(msgspec.Struct):
    """One phase of one run: the requests it is judged on, its tokens and what was sent where."""

    records: list[RequestRecord]
    tokens: int
    span_s: float
    sent: dict[str, int]


def _judge(run: RunResult, scenario: Scenario, pool: Sequence[str], settle_s: float) -> list[_Judged]:
    starts: list[float] = []  # measured window of each phase: [start, end)
    ends: list[float] = []
    begins: list[float] = []  # when each phase began
    t = 0.0
    began = run.phase_starts if len(run.phase_starts) == len(scenario.phases) else None
    for i, ph in enumerate(scenario.phases):
        t0 = began[i] if began is not None else t
        settle = (
            min(OPEN_SETTLE_S, ph.duration_s / 4) if ph.open_loop else (min(settle_s, ph.duration_s / 2) if i else 0.0)
        )
        begins.append(t0)
        starts.append(t0 + settle)
        t = t0 + ph.duration_s
        ends.append(t)
    n = len(ends)
    open_loop = [ph.open_loop for ph in scenario.phases]

    def index(when: float) -> int | None:
        """Phase whose measured window holds `when`, or None in a settling stretch or a drain."""
        i = bisect.bisect_right(starts, when) - 1
        return i if i >= 0 and when < ends[i] else None

    out = [_Judged([], 0, ends[i] - starts[i], {name: 0 for name in pool}) for i in range(n)]
    for when, k in run.tokens_at:
        at = index(when)
        if at is not None:
            out[at].tokens += k
    for r in run.records:
        at = index(r.t_send)
        if at is not None and open_loop[at]:
            out[at].records.append(r)
        elif (done_at := index(r.t_last)) is not None and not open_loop[done_at]:
            out[done_at].records.append(r)
    for r in run.failed:
        at = index(r.t_send)
        if at is not None and open_loop[at]:
            out[at].records.append(r)
    for r in (*run.records, *run.failed):
        if r.backend:
            sent = out[max(bisect.bisect_right(begins, r.t_send) - 1, 0)].sent
            sent[r.backend] = sent.get(r.backend, 0) + 1
    return out


def _summarize(j: _Judged, slo: SLO) -> PhaseMetrics:
    recs = j.records
    done = [r for r in recs if r.status == "ok"]
    rates = [v for r in done if (v := r.decode_tok_s) is not None]
    ttfts = [r.t_first - r.t_send for r in done]
    tpots = [v for r in done if (v := r.tpot_s) is not None]
    e2es = [r.t_last - r.t_send for r in done]
    met = [r for r in done if slo.met(r.t_first - r.t_send, r.tpot_s)]
    good = len(met)
    total = sum(j.sent.values())
    span = j.span_s
    prompt = sum(r.prompt_tokens for r in done)
    return PhaseMetrics(
        aggregate_tok_s=j.tokens / span if span > 0 else 0.0,
        mean_request_tok_s=sum(rates) / len(rates) if rates else 0.0,
        p50_request_tok_s=_pct(rates, 50),
        p99_ttft_ms=_pct(ttfts, 99, 1000.0),
        backend_share={k: (v / total if total else 0.0) for k, v in j.sent.items()},
        requests=len(rates),
        p50_ttft_ms=_pct(ttfts, 50, 1000.0),
        p50_tpot_ms=_pct(tpots, 50, 1000.0),
        p99_tpot_ms=_pct(tpots, 99, 1000.0),
        p50_e2e_s=_pct(e2es, 50),
        p99_e2e_s=_pct(e2es, 99),
        arrived=len(recs),
        shed=sum(1 for r in recs if r.status == "shed"),
        unfinished=sum(1 for r in recs if r.status == "unfinished"),
        slo_attainment=good / len(recs) if recs else 0.0,
        goodput_rps=good / span if span > 0 else 0.0,
        cached_share=sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        slo_request_tok_s=sum(r.decode_tok_s or 0.0 for r in met) / len(recs) if recs else 0.0,
    )


def phase_metrics(
    run: RunResult, scenario: Scenario, pool: Sequence[str], settle_s: float = SETTLE_S, slo: SLO = DEFAULT_SLO
) -> list[PhaseMetrics]:
    return [_summarize(j, slo) for j in _judge(run, scenario, pool, settle_s)]


def pooled_phase_metrics(
    runs: Sequence[RunResult], scenario: Scenario, pool: Sequence[str], slo: SLO = DEFAULT_SLO
) -> list[PhaseMetrics]:
    """Runs of disjoint parts of one open-loop workload (each its own phase timeline: a phase
    starts when the run's previous phase has drained) measured as one: per phase the judged
    requests, tokens and dispatches of all of them together, over the phase's window."""
    judged = [_judge(run, scenario, pool, SETTLE_S) for run in runs]
    out = []
    for parts in zip(*judged, strict=True):
        sent: dict[str, int] = {}
        for part in parts:
            for k, v in part.sent.items():
                sent[k] = sent.get(k, 0) + v
        merged = _Judged(
            [r for part in parts for r in part.records], sum(part.tokens for part in parts), parts[0].span_s, sent
        )
        out.append(_summarize(merged, slo))
    return out


def window_series(
    run: RunResult, start_s: float, end_s: float, width_s: float, step_s: float, objective: str
) -> list[tuple[float, float]]:
    """(window start, objective metric) over sliding windows [t, t + width) from start_s."""
    out = []
    t = start_s
    while t + width_s <= end_s + 1e-9:
        if objective == "latency":
            vals = [v for r in run.records if t <= r.t_last < t + width_s and (v := r.decode_tok_s) is not None]
            out.append((t, sum(vals) / len(vals) if vals else 0.0))
        else:
            k = sum(n for when, n in run.tokens_at if t <= when < t + width_s)
            out.append((t, k / width_s))
        t += step_s
    return out
