"""The virtual-clock evaluation cross-checked end to end over HTTP: twins, gateway, loadgen.

    python -m evaluate.http_check [--time-scale F] [--output DIR] [--seed S]

One cheap scenario, run twice per policy (`least_inflight`, `goodput` with the latency
objective):

(a) on the virtual clock with the evaluation harness (`evaluate.sim.simulate`,
    `evaluate.metrics.phase_metrics`);
(b) over real HTTP: the K2.6 pool's twins (`specroute sim --time-scale F`, the same profiles as
    the evaluation's pool), one gateway per policy (`specroute serve --config`, written here),
    and `loadgen` as the closed-loop client.

For each phase it compares goodput / least_inflight of mean request tok/s and of aggregate
tok/s between (a) and (b); ratios are scale-free, so twins running F x real time give the same
ratios as real timing, as long as client and server overhead stay small against the scaled
step time (the AR row of the warm-up table checks that: AR's C=1 decode tok/s, x F, should be
the engine's 26.3). Exit status 0 when every ratio agrees within the tolerance (10%), 1 when
one does not or a run failed, 2 on a bad command line.

What is compared, defined the same way on both sides (the evaluation's definitions, which are
loadgen's):

- request tok/s: decode tok/s of one request, (n - 1) / (last token - first token), as loadgen's
  `decode_throughput` and the harness's `RequestRecord.decode_tok_s` (not loadgen's
  `output_throughput`, n / E2E, which includes TTFT); mean over the requests that finished
  inside the phase's measured window;
- aggregate tok/s: tokens emitted inside the measured window / its length. The harness counts
  each engine step's tokens at the step's end; over HTTP a request's first token is placed at
  its first-content time and the other n - 1 spread evenly up to its last content (loadgen
  keeps no per-chunk times), which over a phase of many requests is the same count. Not
  loadgen's `output_throughput` (all tokens / first send to last response end): that one
  charges the drain after the deadline, when fewer than C requests are left, to the level.

Structure, the same on both sides:

1. Warm-up (learning policies only): each backend serves `warmup_requests` pinned requests one
   after the other (over HTTP `model: "kimi-k2.6@NAME"`: the gateway feeds pinned requests'
   telemetry to the model's policy too; on the virtual clock a fresh engine per backend and
   the same `Outcome`s fed to the policy). This is what the evaluation's first phase does with
   its cold start, made explicit: the goodput policy has measured every backend before it is
   judged. Over HTTP it is required, not cosmetic: the policy's step-time priors are in real
   seconds, so a twin running at F looks 1/F x faster than its prior once measured, and an
   unmeasured backend predicted from its prior looks 1/F x slower than a measured one and is
   never explored (the exploration floor is 50% of the best). One measured request per backend
   rescales its whole step-time curve.
2. Phases, one per concurrency level, each from an idle pool (loadgen drains between levels; the
   harness runs each phase as its own scenario with the same policy object carried over, as
   one gateway process carries its policy across levels). Closed loop, the domain's prompts,
   max_tokens drawn uniformly in [min_tokens, max_tokens] like the evaluation's scenarios (over
   HTTP from a JSONL file of loadgen's own prompts for the domain with a max_tokens per line).
   A phase is measured from its start to its end (the evaluation's rule for a first phase:
   the cold queue counts); requests in flight at the end do not count on either side.

The gateway polls `/v1/loads` every `poll_s` simulated seconds (its `health.interval_s` is set
to poll_s x F), like the harness.

Why this scenario: math at 4 and 16 clients is where goodput and least_inflight differ clearly
(x1.4 and x1.3 aggregate, x1.12 and x1.04 request tok/s on the virtual clock) and where
least_inflight is deterministic (in a closed loop with C a multiple of the pool size each
client keeps its backend; at C = 1 or 2 it picks among idle backends at random, and 30 requests
of random backends put ~10% of noise on a ratio). One run takes ~90 s at the default time scale
0.25 (~40 s at 0.1: the figures agree as well, the AR check stays within 0.1%).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from backends import BackendSpec, Strategy
from evaluate.metrics import phase_metrics
from evaluate.runner import contestants
from evaluate.scenarios import K26_POOL, Phase, Scenario
from evaluate.sim import MODEL, simulate
from policies.base import Domain, Outcome, Policy
from tools.processes import ProcessGroup, console_script, free_port, spawn, stop, wait_backends_healthy
from twin.engine import Engine
from twin.profile import load_profile

__all__ = [
    "CheckPlan",
    "CheckResult",
    "PhaseFigures",
    "Row",
    "compare",
    "main",
    "print_report",
    "run_check",
    "run_http",
    "run_virtual",
]

POLICIES: tuple[str, ...] = ("least_inflight", "goodput/latency")
REFERENCE = "least_inflight"
CHALLENGER = "goodput/latency"
METRICS: tuple[str, ...] = ("mean_request_tok_s", "aggregate_tok_s")
SERVED_MODEL = "kimi-k2.6"  # the K2.6 twins' served model name
AR_C1_TOK_S = 26.3  # R1: the AR twin's C=1 per-request tok/s, for the overhead check
OVERHEAD_WARN = 0.03  # warn when the AR twin over HTTP is further off than this


@dataclass(frozen=True)
class CheckPlan:
    """What to run; durations are simulated seconds."""

    concurrencies: tuple[int, ...] = (4, 16)
    phase_s: float = 60.0
    domain: str = "math"
    min_tokens: int = 384  # the evaluation scenarios' range
    max_tokens: int = 640
    warmup_requests: int = 2  # per backend, pinned, one after the other
    time_scale: float = 0.25
    poll_s: float = 1.0
    seed: int = 0
    tolerance: float = 0.10
    pool: tuple[str, ...] = K26_POOL
    policies: tuple[str, ...] = POLICIES

    def scenario(self, concurrency: int) -> Scenario:
        return Scenario(
            name=f"http-{self.domain}-c{concurrency}",
            description=f"{concurrency} clients, {self.domain} only, from an idle pool",
            pool=self.pool,
            phases=(
                Phase(
                    name=f"{self.domain}-c{concurrency}",
                    duration_s=self.phase_s,
                    concurrency=concurrency,
                    domains={self.domain: 1.0},
                ),
            ),
            min_tokens=self.min_tokens,
            max_tokens=self.max_tokens,
        )


class PhaseFigures(msgspec.Struct, kw_only=True):
    """One policy in one phase, in simulated seconds."""

    aggregate_tok_s: float
    mean_request_tok_s: float
    requests: int  # finished inside the window (request tok/s samples)
    backend_share: dict[str, float]  # of the requests sent during the phase
    errors: int = 0


class Row(msgspec.Struct, kw_only=True):
    phase: str
    concurrency: int
    metric: str
    virtual: dict[str, float]  # policy -> figure
    http: dict[str, float]
    virtual_ratio: float
    http_ratio: float
    diff: float  # http_ratio / virtual_ratio - 1
    agrees: bool


class CheckResult(msgspec.Struct, kw_only=True):
    plan: dict[str, Any]
    virtual: dict[str, list[PhaseFigures]]
    http: dict[str, list[PhaseFigures]]
    # per backend: C=1 decode tok/s of the warm-up requests, virtual vs HTTP (x F)
    warmup: dict[str, dict[str, float]]
    rows: list[Row]
    agrees: bool
    wall_s: float = 0.0


# ---------------------------------------------------------------------------------- prompts


def _domain_prompts(domain: str) -> list[str]:
    """loadgen's built-in prompts for `domain`, read as data (policies do not import loadgen)."""
    spec = importlib.util.find_spec("loadgen")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the loadgen package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{domain}.jsonl"
    out = []
    for line in path.read_text("utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            out.append(item if isinstance(item, str) else item["prompt"])
    return out


def _token_draws(plan: CheckPlan, n: int, salt: str) -> list[int]:
    rng = random.Random(f"{plan.seed}:{salt}")
    return [rng.randint(plan.min_tokens, plan.max_tokens) for _ in range(n)]


def write_dataset(plan: CheckPlan, path: Path, n: int, salt: str = "phases") -> list[tuple[str, int]]:
    """A loadgen JSONL dataset: the domain's prompts in turn, each line with its own max_tokens."""
    prompts = _domain_prompts(plan.domain)
    items = [(prompts[i % len(prompts)], t) for i, t in enumerate(_token_draws(plan, n, salt))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p, "domain": plan.domain, "max_tokens": t}) + "\n" for p, t in items))
    return items


def _phase_requests_bound(plan: CheckPlan) -> int:
    """More prompts than any phase sends, so that loadgen never cycles within a phase."""
    fastest = 200.0  # tok/s of one request, above any K2.6 backend
    per_client = plan.phase_s * fastest / plan.min_tokens + 2
    return int(max(plan.concurrencies) * per_client) + 16


# ---------------------------------------------------------------------------- virtual clock


def _specs(pool: Sequence[str]) -> list[BackendSpec]:
    """The specs `simulate` gives the policy (same names, model and strategies)."""
    return [
        BackendSpec(name=n, url=f"sim://{n}", model=MODEL, strategy=Strategy(load_profile(n).strategy)) for n in pool
    ]


def _learns(policy_name: str) -> bool:
    return policy_name.startswith("goodput")


def virtual_warmup(policy: Policy, plan: CheckPlan, items: Sequence[tuple[str, int]]) -> dict[str, float]:
    """Each backend serves `items` alone, one request at a time, on a fresh engine seeded like
    the harness's (and like the twins of the HTTP run); every finished request is fed to the
    policy as the gateway would. Returns the mean decode tok/s per backend."""
    rates: dict[str, float] = {}
    for i, name in enumerate(plan.pool):
        engine = Engine(load_profile(name), seed=plan.seed * 7919 + i)
        now = 0.0
        seen: list[float] = []
        for k, (prompt, max_tokens) in enumerate(items):
            rid = f"warmup-{k}"
            text = f"user: {prompt}\n"  # the twin renders chat messages this way
            req = engine.submit(rid, math.ceil(len(text) / 4), max_tokens, text)
            t_send, t_first, n, reason = now, -1.0, 0, None
            done = False
            while not done:
                res = engine.step()
                now += res.duration_s
                for em in res.emissions:
                    if em.rid != rid:
                        continue
                    n += em.n_tokens
                    if t_first < 0:
                        t_first = now
                    if em.finished:
                        done, reason = True, em.finish_reason
            verify = req.verify_ct or None
            policy.observe(
                Outcome(
                    backend=name,
                    domain=Domain(plan.domain),
                    inflight_at_dispatch=1,
                    mean_inflight=1.0,
                    prompt_tokens=0,
                    completion_tokens=n,
                    ttft_s=t_first - t_send,
                    decode_s=now - t_first,
                    verify_ct=verify,
                    accept_length=n / verify if verify else None,
                    finish_reason=reason,
                )
            )
            if n > 1 and now > t_first:
                seen.append((n - 1) / (now - t_first))
        rates[name] = sum(seen) / len(seen) if seen else 0.0
    return rates


def _given(policy: Policy) -> Callable[[dict[str, Engine], list[BackendSpec]], Policy]:
    return lambda _e, _s: policy


def run_virtual(
    plan: CheckPlan, items: Sequence[tuple[str, int]]
) -> tuple[dict[str, list[PhaseFigures]], dict[str, float]]:
    """(a): per policy, the figures of every phase; and the warm-up's tok/s per backend."""
    table = contestants(plan.pool, ["latency"], plan.seed)
    specs = _specs(plan.pool)
    out: dict[str, list[PhaseFigures]] = {}
    warm: dict[str, float] = {}
    for name in plan.policies:
        policy = table[name][1]({}, specs)
        if _learns(name) and plan.warmup_requests:
            warm = virtual_warmup(policy, plan, items)
        figures = []
        for c in plan.concurrencies:
            scn = plan.scenario(c)
            run = simulate(scn, _given(policy), seed=plan.seed, poll_s=plan.poll_s)
            m = phase_metrics(run, scn, list(plan.pool))[0]
            figures.append(
                PhaseFigures(
                    aggregate_tok_s=m.aggregate_tok_s,
                    mean_request_tok_s=m.mean_request_tok_s,
                    requests=m.requests,
                    backend_share=m.backend_share,
                )
            )
        out[name] = figures
    return out, warm


# ------------------------------------------------------------------------------------ HTTP


def gateway_toml(plan: CheckPlan, policy_name: str, port: int, twins: dict[str, str]) -> str:
    """Config of one gateway over the twins: `least_inflight` or `goodput/OBJECTIVE`."""
    policy, _, objective = policy_name.partition("/")
    lines = [
        "# written by evaluate.http_check",
        "[gateway]",
        f'listen = "127.0.0.1:{port}"',
        f'policy = "{policy}"',
    ]
    if objective:
        lines.append(f'objective = "{objective}"')
    lines += [
        "",
        "[health]",
        f"interval_s = {plan.poll_s * plan.time_scale!r}",
        "",
        "[logging]",
        "access_log = false",
        "",
        f'[models."{SERVED_MODEL}"]',
        f"seed = {plan.seed}",
    ]
    for name, url in twins.items():
        lines += [
            "",
            "[[backends]]",
            f'name = "{name}"',
            f'url = "{url}"',
            f'model = "{SERVED_MODEL}"',
            f'strategy = "{Strategy(load_profile(name).strategy).value}"',
        ]
    return "\n".join(lines) + "\n"


def _wait_backends_healthy(gateway: str) -> None:
    if not wait_backends_healthy(gateway):
        raise RuntimeError(f"the gateway at {gateway} does not report every backend healthy")


def _loadgen(args: Sequence[str], out_dir: Path, timeout: float) -> None:
    cmd = [console_script("loadgen"), *args, "--output", str(out_dir), "--no-plots", "--no-progress"]
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "loadgen.log"
    log.unlink(missing_ok=True)
    proc = spawn(cmd, log_file=log)
    try:
        code = proc.wait(timeout)
    finally:
        stop(proc)  # at the timeout (TimeoutExpired propagates), and anything it left behind
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"loadgen exited with {code}: {tail[0] if tail else ''} (log: {log})")


def _records(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def http_figures(records: Sequence[dict[str, Any]], plan: CheckPlan, pool: Sequence[str]) -> PhaseFigures:
    """One loadgen level's requests -> the harness's phase figures, in simulated seconds.

    Times: `start_s` (after the level's start), `ttft_ms`, and the last content arrival
    recovered from `decode_throughput` = (n - 1) / (last - first); all divided by F.
    """
    f = plan.time_scale
    end = plan.phase_s
    tokens = 0.0
    rates: list[float] = []
    sent = {name: 0 for name in pool}
    errors = 0
    for r in records:
        if r["start_s"] / f < end:
            b = r.get("backend")
            if b:
                sent[b] = sent.get(b, 0) + 1
        if not r.get("ok"):
            errors += 1
            continue
        n = int(r.get("output_tokens") or 0)
        if n <= 0 or r.get("ttft_ms") is None:
            continue
        first = (r["start_s"] + r["ttft_ms"] / 1000.0) / f
        dtp = r.get("decode_throughput")
        last = first + ((n - 1) / dtp / f if dtp else 0.0)
        if first < end:
            tokens += 1
            if n > 1 and last > first:  # n - 1 tokens spread over (first, last]
                tokens += (n - 1) * (min(last, end) - first) / (last - first)
        if last < end and dtp:
            rates.append(dtp * f)
    total = sum(sent.values())
    return PhaseFigures(
        aggregate_tok_s=tokens / end,
        mean_request_tok_s=sum(rates) / len(rates) if rates else 0.0,
        requests=len(rates),
        backend_share={k: v / total if total else 0.0 for k, v in sent.items()},
        errors=errors,
    )


def _wall(plan: CheckPlan, simulated_s: float) -> float:
    return simulated_s * plan.time_scale


def run_http(
    plan: CheckPlan, out: Path, *, log: Callable[[str], None] = lambda s: None
) -> tuple[dict[str, list[PhaseFigures]], dict[str, float]]:
    """(b): twins, one gateway per policy, loadgen; per policy the figures of every phase, and
    the warm-up's C=1 decode tok/s per backend (simulated)."""
    specroute = console_script("specroute")
    n_items = _phase_requests_bound(plan)
    dataset = out / "dataset.jsonl"
    write_dataset(plan, dataset, n_items)
    write_dataset(plan, out / "warmup.jsonl", plan.warmup_requests, salt="warmup")
    ar_request_s = plan.max_tokens / 20.0  # simulated seconds, slower than any K2.6 backend
    results: dict[str, list[PhaseFigures]] = {}
    warm: dict[str, float] = {}
    with ProcessGroup(out / "logs") as servers:
        twins: dict[str, str] = {}
        for i, name in enumerate(plan.pool):
            port = free_port()
            servers.start(
                name,
                [
                    specroute,
                    "sim",
                    "--profile",
                    name,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--seed",
                    str(plan.seed * 7919 + i),
                    "--time-scale",
                    repr(plan.time_scale),
                ],
            )
            twins[name] = f"http://127.0.0.1:{port}"
        servers.wait_ready({n: u + "/ready" for n, u in twins.items()})
        log(f"twins ready: {', '.join(plan.pool)} (time scale {plan.time_scale})")
        for policy_name in plan.policies:
            tag = policy_name.replace("/", "-")
            port = free_port()
            config = out / f"gateway-{tag}.toml"
            config.write_text(gateway_toml(plan, policy_name, port, twins))
            gw = f"http://127.0.0.1:{port}"
            servers.start(f"gateway-{tag}", [specroute, "serve", "--config", str(config)])
            servers.wait_ready({f"gateway-{tag}": gw + "/health"})
            _wait_backends_healthy(gw)
            common = ["--target", "gateway", "--gateway-url", gw, "--seed", str(plan.seed)]
            if _learns(policy_name) and plan.warmup_requests:
                for name in plan.pool:
                    wdir = out / tag / f"warmup-{name}"
                    _loadgen(
                        [
                            *common,
                            "--model",
                            f"{SERVED_MODEL}@{name}",
                            "--concurrency",
                            "1",
                            "--num-prompts",
                            str(plan.warmup_requests),
                            "--dataset",
                            f"jsonl:{out / 'warmup.jsonl'}",
                        ],
                        wdir,
                        timeout=60 + _wall(plan, 3 * plan.warmup_requests * ar_request_s),
                    )
                    recs = [r for r in _records(wdir) if r.get("ok") and r.get("decode_throughput")]
                    warm[name] = (
                        (sum(r["decode_throughput"] for r in recs) / len(recs) * plan.time_scale) if recs else 0.0
                    )
                log(
                    f"{policy_name}: warm-up done: "
                    + ", ".join(f"{n} {v:.1f}" for n, v in warm.items())
                    + " tok/s (C=1, simulated)"
                )
            pdir = out / tag / "phases"
            _loadgen(
                [
                    *common,
                    "--concurrency",
                    ",".join(map(str, plan.concurrencies)),
                    "--duration",
                    repr(_wall(plan, plan.phase_s)),
                    "--dataset",
                    f"jsonl:{dataset}",
                    "--max-tokens",
                    str(plan.max_tokens),
                ],
                pdir,
                timeout=120 + len(plan.concurrencies) * _wall(plan, 3 * (plan.phase_s + 4 * ar_request_s)),
            )
            recs = _records(pdir)
            results[policy_name] = [
                http_figures([r for r in recs if r.get("max_concurrency") == c], plan, plan.pool)
                for c in plan.concurrencies
            ]
            servers.stop(f"gateway-{tag}")
            log(
                f"{policy_name}: "
                + "; ".join(
                    f"C={c}: req {m.mean_request_tok_s:.1f} agg {m.aggregate_tok_s:.1f}"
                    for c, m in zip(plan.concurrencies, results[policy_name], strict=False)
                )
            )
    return results, warm


# ---------------------------------------------------------------------------------- compare


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def compare(plan: CheckPlan, virtual: dict[str, list[PhaseFigures]], http: dict[str, list[PhaseFigures]]) -> list[Row]:
    rows = []
    for i, c in enumerate(plan.concurrencies):
        for metric in METRICS:
            v = {p: getattr(virtual[p][i], metric) for p in plan.policies}
            h = {p: getattr(http[p][i], metric) for p in plan.policies}
            vr = _ratio(v[CHALLENGER], v[REFERENCE])
            hr = _ratio(h[CHALLENGER], h[REFERENCE])
            diff = hr / vr - 1.0 if vr > 0 else math.nan
            rows.append(
                Row(
                    phase=f"{plan.domain}-c{c}",
                    concurrency=c,
                    metric=metric,
                    virtual=v,
                    http=h,
                    virtual_ratio=vr,
                    http_ratio=hr,
                    diff=diff,
                    agrees=math.isfinite(diff) and abs(diff) <= plan.tolerance,
                )
            )
    return rows


def run_check(plan: CheckPlan, out: Path, *, log: Callable[[str], None] = lambda s: None) -> CheckResult:
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    warm_items = write_dataset(plan, out / "warmup.jsonl", plan.warmup_requests, salt="warmup")
    virtual, v_warm = run_virtual(plan, warm_items)
    log(
        "virtual clock: "
        + "; ".join(
            f"{p} "
            + " ".join(
                f"C={c} req {m.mean_request_tok_s:.1f} agg {m.aggregate_tok_s:.1f}"
                for c, m in zip(plan.concurrencies, virtual[p], strict=False)
            )
            for p in plan.policies
        )
    )
    http, h_warm = run_http(plan, out, log=log)
    rows = compare(plan, virtual, http)
    warm = {
        name: {"virtual": v_warm.get(name, 0.0), "http": h_warm.get(name, 0.0)}
        for name in plan.pool
        if name in v_warm or name in h_warm
    }
    plan_dict = asdict(plan)
    return CheckResult(
        plan=plan_dict,
        virtual=virtual,
        http=http,
        warmup=warm,
        rows=rows,
        agrees=all(r.agrees for r in rows),
        wall_s=time.perf_counter() - t0,
    )


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


def print_report(res: CheckResult, out: IO[str]) -> None:
    plan = res.plan
    tol = plan["tolerance"]
    out.write(
        f"\n== HTTP cross-check: {', '.join(plan['pool'])}; {plan['domain']}, "
        f"max_tokens {plan['min_tokens']}-{plan['max_tokens']}, {plan['phase_s']:.0f} s phases, "
        f"time scale {plan['time_scale']} ({res.wall_s:.0f} s)\n"
    )
    if res.warmup:
        out.write("warm-up, C=1 decode tok/s per backend (simulated; HTTP measured x F):\n")
        for name, w in res.warmup.items():
            note = ""
            if name.endswith("-ar") and w["http"]:
                note = f"  (AR: {100 * (w['http'] / AR_C1_TOK_S - 1):+.1f}% vs {AR_C1_TOK_S})"
            out.write(
                f"  {name:12s} virtual {w['virtual']:7.1f}  http {w['http']:7.1f}  "
                f"{100 * (_ratio(w['http'], w['virtual']) - 1):+5.1f}%{note}\n"
            )
        ar = next((w["http"] for n, w in res.warmup.items() if n.endswith("-ar")), None)
        if ar and abs(ar / AR_C1_TOK_S - 1) > OVERHEAD_WARN:
            out.write(
                f"  warning: the AR twin's C=1 tok/s over HTTP is {100 * (ar / AR_C1_TOK_S - 1):+.1f}% "
                "off its engine figure: client/server overhead is not small at this time "
                "scale (try a larger --time-scale)\n"
            )
    out.write(
        f"{'phase':10s} {'metric':18s} {'LI virt':>8s} {'GP virt':>8s} {'ratio':>6s}   "
        f"{'LI http':>8s} {'GP http':>8s} {'ratio':>6s}   {'diff':>6s}  within {tol:.0%}\n"
    )
    for r in res.rows:
        out.write(
            f"{r.phase:10s} {r.metric:18s} {_fmt(r.virtual[REFERENCE]):>8s} "
            f"{_fmt(r.virtual[CHALLENGER]):>8s} {r.virtual_ratio:6.3f}   "
            f"{_fmt(r.http[REFERENCE]):>8s} {_fmt(r.http[CHALLENGER]):>8s} {r.http_ratio:6.3f}   "
            f"{100 * r.diff:+5.1f}%  {'yes' if r.agrees else 'NO'}\n"
        )
    out.write("backend share of requests sent (virtual | http):\n")
    for p in plan["policies"]:
        for i, c in enumerate(plan["concurrencies"]):
            v, h = res.virtual[p][i], res.http[p][i]
            shares = "  ".join(
                f"{b.removeprefix('k26-')} {v.backend_share.get(b, 0):.2f}|{h.backend_share.get(b, 0):.2f}"
                for b in plan["pool"]
            )
            err = f"  errors {h.errors}" if h.errors else ""
            out.write(f"  {p:16s} C={c:<3d} {shares}   requests {v.requests}|{h.requests}{err}\n")
    out.write(f"ratios agree within {tol:.0%}: {'yes' if res.agrees else 'NO'}\n")


# -------------------------------------------------------------------------------------- CLI


def _concurrencies(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"concurrencies must be >= 1: {text!r}")
    return out


def parser() -> argparse.ArgumentParser:
    d = CheckPlan()
    ap = argparse.ArgumentParser(
        prog="specroute eval --http",
        description="Run one scenario on the virtual clock and over HTTP (twins, gateway, loadgen) "
        "and compare goodput/least_inflight ratios.",
    )
    ap.add_argument(
        "--time-scale", type=float, default=d.time_scale, help=f"twins run at F x real time (default {d.time_scale})"
    )
    ap.add_argument(
        "--output",
        type=Path,
        default=Path("out/eval-http"),
        help="directory for http_check.json, configs, loadgen outputs, logs",
    )
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument(
        "--concurrency",
        type=_concurrencies,
        default=d.concurrencies,
        help=f"phases, comma-separated (default {','.join(map(str, d.concurrencies))})",
    )
    ap.add_argument(
        "--phase-seconds", type=float, default=d.phase_s, help=f"simulated seconds per phase (default {d.phase_s:.0f})"
    )
    ap.add_argument("--domain", choices=[x.value for x in Domain], default=d.domain)
    ap.add_argument("--min-tokens", type=int, default=d.min_tokens)
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ap.add_argument(
        "--warmup-requests",
        type=int,
        default=d.warmup_requests,
        help="pinned requests per backend before the goodput run (default 2)",
    )
    ap.add_argument("--tolerance", type=float, default=d.tolerance)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if (
        not 0 < args.time_scale <= 10
        or args.phase_seconds <= 0
        or not 1 <= args.min_tokens <= args.max_tokens
        or args.warmup_requests < 0
        or args.tolerance <= 0
    ):
        print(
            "http_check: need 0 < --time-scale <= 10, --phase-seconds > 0, "
            "1 <= --min-tokens <= --max-tokens, --warmup-requests >= 0, --tolerance > 0",
            file=sys.stderr,
        )
        return 2
    plan = CheckPlan(
        concurrencies=args.concurrency,
        phase_s=args.phase_seconds,
        domain=args.domain,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        warmup_requests=args.warmup_requests,
        time_scale=args.time_scale,
        seed=args.seed,
        tolerance=args.tolerance,
    )

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        res = run_check(plan, args.output, log=log)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"http_check: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("http_check: interrupted", file=sys.stderr)
        return 130
    print_report(res, sys.stdout)
    path = args.output / "http_check.json"
    path.write_bytes(msgspec.json.format(msgspec.json.encode(res), indent=2) + b"\n")
    print(f"wrote {path}")
    return 0 if res.agrees else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
