"""`specroute plan --verify`: the plan's winner and the best homogeneous fleet (the runner-up when
the winner is homogeneous), over real HTTP.

One phase of the traffic (the one with the highest arrival rate: where fleets differ most) is
run twice per fleet, as single requests of the phase's domains (loadgen's prompts; the sessions,
tools and long documents of the full traffic are the virtual clock's): (a) on the virtual clock,
(b) over HTTP with one twin per server (`specroute sim`, DDTree budget and step-time scale as the
fleet says, acceleration `time_scale`), a gateway (`specroute serve`) with the fleet's specroute
policy (goodput for the winner; the best of goodput and least_inflight for the homogeneous fleet,
since SGLang's router is not installed here, `make bench-routers` runs it) and loadgen as the
open-loop client at the phase's mean rate, Poisson on both sides (loadgen's process: a bursty
phase is checked at its mean rate). The load is the phase's fraction of the reference capacity
for these single requests, so the fleets are as loaded as in the plan.

It passes when the winner / homogeneous (or runner-up) ratio of mean request tok/s over HTTP is within
`TOLERANCE` of the virtual clock's: the ranking the plan printed holds on real processes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import msgspec

from backends import Strategy
from common.percentile import percentile
from evaluate.capacity import reference_rate
from evaluate.fleet import parse_fleet
from evaluate.http_check import _domain_prompts, _loadgen, _records, _wait_backends_healthy
from evaluate.metrics import phase_metrics
from evaluate.plan import PlanResult
from evaluate.runner import contestants
from evaluate.scenarios import Scenario
from evaluate.sim import fleet_servers, simulate
from evaluate.traffic import Traffic
from tools.processes import ProcessGroup, console_script, free_port

__all__ = ["TOLERANCE", "VerifyResult", "print_verify", "verify"]

TOLERANCE = 0.15
CPU_BOUND = 3.0  # HTTP e2e p99 this many times the virtual clock's: the processes could not keep up
SERVED_MODEL = "kimi-k2.6"
PHASE_S = 90.0


class FleetRun(msgspec.Struct, kw_only=True):
    fleet: str
    policy: str
    virtual_tok_s: float
    http_tok_s: float
    virtual_e2e_p99_s: float
    http_e2e_p99_s: float
    http_requests: int
    http_errors: int


class VerifyResult(msgspec.Struct, kw_only=True):
    versus: str  # what the winner is compared with: "homogeneous", or "runner-up" when the winner is homogeneous
    phase: str
    rate_rps: float
    time_scale: float
    runs: list[FleetRun]
    virtual_ratio: float
    http_ratio: float
    diff: float
    agrees: bool


def _gateway_toml(policy: str, port: int, twins: dict[str, tuple[str, str]], poll_s: float) -> str:
    name, _, objective = policy.partition("/")
    lines = ["# written by specroute plan --verify", "[gateway]", f'listen = "127.0.0.1:{port}"', f'policy = "{name}"']
    if objective:
        lines.append(f'objective = "{objective}"')
    lines += ["", "[health]", f"interval_s = {poll_s!r}", "", "[logging]", "access_log = false"]
    for backend, (url, strategy) in twins.items():
        lines += [
            "",
            "[[backends]]",
            f'name = "{backend}"',
            f'url = "{url}"',
            f'model = "{SERVED_MODEL}"',
            f'strategy = "{strategy}"',
        ]
    return "\n".join(lines) + "\n"


def _http_run(
    fleet: str,
    policy: str,
    rate: float,
    domains: dict[str, float],
    tokens: tuple[int, int],
    time_scale: float,
    seed: int,
    out: Path,
    log: Callable[[str], None],
    phase_s: float,
) -> tuple[float, float, int, int]:
    """(mean request tok/s, e2e p99 s, requests, errors) in simulated units."""
    servers = fleet_servers(
        msgspec.structs.replace(
            _probe(), pool=tuple(m.label if m.count == 1 else f"{m.count}x{m.label}" for m in parse_fleet(fleet))
        )
    )
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:verify")
    names, weights = list(domains), list(domains.values())
    prompts = {d: _domain_prompts(d) for d in names}
    n_items = int(rate * phase_s * 1.5) + 50
    dataset = out / "dataset.jsonl"
    with dataset.open("w") as f:
        for i in range(n_items):
            d = rng.choices(names, weights)[0]
            f.write(
                json.dumps({"prompt": prompts[d][i % len(prompts[d])], "domain": d, "max_tokens": rng.randint(*tokens)})
                + "\n"
            )
    specroute = console_script("specroute")
    with ProcessGroup(out / "logs") as procs:
        twins: dict[str, tuple[str, str]] = {}
        for i, s in enumerate(servers):
            port = free_port()
            cmd = [
                specroute,
                "sim",
                "--profile",
                s.member.profile,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--seed",
                str(seed * 7919 + i),
                "--time-scale",
                repr(time_scale * s.member.time_scale),
            ]
            if s.member.budget is not None:
                cmd += ["--ddtree-budget", str(s.member.budget)]
            if s.member.accept_scale != 1.0:
                cmd += ["--fault-accept-drop-at", "0", "--fault-accept-drop-to", repr(s.member.accept_scale)]
            procs.start(s.name, cmd)
            twins[s.name] = (f"http://127.0.0.1:{port}", Strategy(s.member.build_profile().strategy).value)
        procs.wait_ready({n: u + "/ready" for n, (u, _) in twins.items()})
        port = free_port()
        config = out / "gateway.toml"
        config.write_text(_gateway_toml(policy, port, twins, poll_s=time_scale))
        gw = f"http://127.0.0.1:{port}"
        procs.start("gateway", [specroute, "serve", "--config", str(config)])
        procs.wait_ready({"gateway": gw + "/health"})
        _wait_backends_healthy(gw)
        log(f"  verify {fleet} behind {policy}: {rate:.2f} req/s for {phase_s:.0f} simulated s")
        _loadgen(
            [
                "--target",
                "gateway",
                "--gateway-url",
                gw,
                "--seed",
                str(seed),
                "--request-rate",
                repr(rate / time_scale),
                "--concurrency",
                "inf",
                "--duration",
                repr(phase_s * time_scale),
                "--dataset",
                f"jsonl:{dataset}",
                "--max-tokens",
                str(tokens[1]),
            ],
            out / "loadgen",
            timeout=120 + 20 * phase_s * time_scale,
        )
    recs = _records(out / "loadgen")
    ok = [r for r in recs if r.get("ok") and r.get("decode_throughput")]
    rates = [r["decode_throughput"] * time_scale for r in ok]
    e2e = [r["e2e_ms"] / 1000 / time_scale for r in ok if r.get("e2e_ms") is not None]
    return (
        sum(rates) / len(rates) if rates else 0.0,
        percentile(e2e, 99) or 0.0,
        len(recs),
        sum(1 for r in recs if not r.get("ok")),
    )


def _probe() -> Scenario:
    """A minimal scenario to name a fleet's servers with."""
    return Scenario(name="verify", description="", pool=("k26-dflash",), phases=())


def verify(
    res: PlanResult,
    traffic: Traffic,
    *,
    time_scale: float,
    seed: int,
    output: Path,
    log: Callable[[str], None] = lambda s: None,
    phase_s: float = PHASE_S,
) -> VerifyResult:
    if not 0 < time_scale <= 1:
        raise RuntimeError(f"--verify-time-scale must be in (0, 1], got {time_scale}")
    scenario = traffic.scenario
    i = max(range(len(scenario.phases)), key=lambda k: res.rates_rps[scenario.phases[k].name])
    ph = msgspec.structs.replace(
        scenario.phases[i], mix=None, arrival="poisson", burst=None, duration_s=phase_s, represents_s=0.0
    )
    # the virtual clock's prompts as long as loadgen's (the twin counts a token per 4 characters)
    lengths = [len(f"user: {t}\n") // 4 for d in ph.domains for t in _domain_prompts(d)]
    single = msgspec.structs.replace(
        scenario, phases=(ph,), degrade=None, prompt_tokens=(max(1, min(lengths)), max(lengths))
    )
    n = res.servers
    given = traffic.rates[i]
    rate = (
        ph.load * reference_rate(single, ph, n)
        if given is None
        else given / reference_rate(scenario, scenario.phases[i], n) * reference_rate(single, ph, n)
    )
    win = res.ranked[0]
    # checked against the best homogeneous fleet; when that is the winner, against the runner-up
    rival, versus = res.best_homogeneous, "homogeneous"
    if rival.fleet == win.fleet and len(res.ranked) > 1:
        rival, versus = res.ranked[1], "runner-up"
    rival_policy = max(
        (p for p in rival.policies_tried if not p.startswith("sglang/")), key=lambda p: rival.policies_tried[p]
    )
    runs = []
    for label, fleet, policy in (
        ("winner", win.fleet, win.policy if not win.policy.startswith("sglang/") else "goodput/latency"),
        (versus, rival.fleet, rival_policy),
    ):
        moved = msgspec.structs.replace(
            single, pool=tuple(m.label if m.count == 1 else f"{m.count}x{m.label}" for m in parse_fleet(fleet))
        )
        names = [s.name for s in fleet_servers(moved)]
        _, factory = contestants(names, ("latency", "throughput"), seed, statics={}, slo=res.slo)[policy]
        m = phase_metrics(simulate(moved, factory, seed=seed, phase_rates=[rate]), moved, names, slo=res.slo)[0]
        http_tok_s, http_e2e, requests, errors = _http_run(
            fleet,
            policy,
            rate,
            dict(ph.domains),
            (scenario.min_tokens, scenario.max_tokens),
            time_scale,
            seed,
            output / label,
            log,
            phase_s,
        )
        runs.append(
            FleetRun(
                fleet=fleet,
                policy=policy,
                virtual_tok_s=m.mean_request_tok_s,
                http_tok_s=http_tok_s,
                virtual_e2e_p99_s=m.p99_e2e_s,
                http_e2e_p99_s=http_e2e,
                http_requests=requests,
                http_errors=errors,
            )
        )
    vr = runs[0].virtual_tok_s / runs[1].virtual_tok_s if runs[1].virtual_tok_s else math.nan
    hr = runs[0].http_tok_s / runs[1].http_tok_s if runs[1].http_tok_s else math.nan
    diff = hr / vr - 1 if vr and math.isfinite(vr) else math.nan
    return VerifyResult(
        versus=versus,
        phase=ph.name,
        rate_rps=rate,
        time_scale=time_scale,
        runs=runs,
        virtual_ratio=vr,
        http_ratio=hr,
        diff=diff,
        agrees=math.isfinite(diff) and abs(diff) <= TOLERANCE and all(r.http_errors == 0 for r in runs),
    )


def print_verify(v: VerifyResult, out: TextIO) -> None:
    out.write(
        f"\n== verify over HTTP: phase {v.phase} as single requests, Poisson at {v.rate_rps:.2f} req/s "
        f"(twins at {v.time_scale}x real time)\n"
    )
    out.write(f"{'fleet':44s} {'policy':18s} {'virtual':>8s} {'http':>8s} {'e2e p99 v/h s':>14s} {'errors':>6s}\n")
    for r in v.runs:
        out.write(
            f"{r.fleet:44.44s} {r.policy:18s} {r.virtual_tok_s:8.1f} {r.http_tok_s:8.1f} "
            f"{r.virtual_e2e_p99_s:6.1f}/{r.http_e2e_p99_s:<6.1f} {r.http_errors:6d}\n"
        )
    out.write(
        f"winner / {v.versus}: virtual {v.virtual_ratio:.3f}, http {v.http_ratio:.3f} ({100 * v.diff:+.1f}%): "
        f"{'agrees' if v.agrees else 'DISAGREES'} within {TOLERANCE:.0%}\n"
    )
    slow = max((r.http_e2e_p99_s / r.virtual_e2e_p99_s for r in v.runs if r.virtual_e2e_p99_s > 0), default=1.0)
    if slow > CPU_BOUND:
        out.write(
            f"warning: e2e p99 over HTTP is {slow:.1f}x the virtual clock's: the twins, gateway and loadgen "
            "look CPU-bound at this acceleration (each simulated second runs in "
            f"{v.time_scale} s); rerun with a larger --verify-time-scale or on a less busy machine\n"
        )
