"""Micro-benchmark of `choose`: it runs for every request, so its cost is a feature.

    python -m bench.choose [--backends 16] [--iterations 20000] [--warmup 0] [--only ROW]

Prints microseconds per decision for each policy on a pool of mixed strategies with varied
loads (not a test: timings depend on the machine and whoever else is using it). The goodput rows
run twice: on requests without a conversation prefix, and with prefix tracking on a session
workload (`_sessions`): every request carries the hash chain of its history, a system prompt
shared by all conversations plus its own turns, and the decision includes the lookup of every
candidate's cached depth and the recording of the chain on the chosen backend.

`python -m bench.decisions` counts the instructions of these decisions under callgrind instead: a
figure that does not move with the machine's load.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from backends import BackendSpec, Strategy
from policies.base import BackendView, Domain, RequestFeatures
from policies.prefix import message_blocks
from policies.registry import make_policy

__all__ = ["ROWS", "bench_choose", "main"]


def _pool(n: int, rng: random.Random) -> list[BackendView]:
    strategies = list(Strategy)
    return [
        BackendView(
            spec=BackendSpec(name=f"b{i}", url="http://x", model="m", strategy=strategies[i % len(strategies)]),
            inflight=rng.randrange(0, 40),
            reported_running=rng.randrange(0, 40),
            reported_waiting=0,
            max_running=48,
        )
        for i in range(n)
    ]


def _plain() -> list[RequestFeatures]:
    return [RequestFeatures(model="m", domain=d, prompt_tokens=200, max_tokens=256) for d in Domain]


def _sessions(rng: random.Random, conversations: int = 200, turns: int = 8) -> list[RequestFeatures]:
    """Turns of `conversations` chats sharing a ~1,000-token system prompt, each turn adding a
    ~150-token question and a ~400-token answer: 16-70 blocks of history per request."""
    system = {"role": "system", "content": "You are a careful assistant. " * 140}
    out: list[RequestFeatures] = []
    for c in range(conversations):
        history: list[dict[str, str]] = [system]
        for t in range(turns):
            history.append({"role": "user", "content": f"conversation {c} turn {t}: " + "why? " * 120})
            chain = message_blocks(history)
            chars = sum(len(m["content"]) for m in history)
            out.append(
                RequestFeatures(
                    model="m",
                    domain=list(Domain)[(c + t) % 3],
                    prompt_tokens=chars // 4,
                    max_tokens=512,
                    temperature=rng.choice((0.0, 0.6, 1.0)),
                    prefix=chain,
                )
            )
            history.append({"role": "assistant", "content": f"answer {c}.{t} " + "because. " * 180})
    rng.shuffle(out)
    return out


def bench_choose(
    policy_name: str = "goodput",
    backends: int = 16,
    iterations: int = 20000,
    sessions: bool = False,
    *,
    warmup: int = 0,
    runs: int = 3,
    **options: Any,
) -> float:
    """Mean CPU microseconds per `choose` over `iterations` decisions after `warmup` untimed ones
    (best of `runs` runs)."""
    rng = random.Random(0)
    views = _pool(backends, rng)
    requests = _sessions(rng) if sessions else _plain()
    n = len(requests)
    best = float("inf")
    for _ in range(runs):
        policy = make_policy(policy_name, **options)  # fresh: the prefix tracker starts empty each run
        for i in range(warmup):
            policy.choose(requests[i % n], views)
        t = time.process_time()  # CPU time: on a shared box, time descheduled is not the policy's
        for i in range(warmup, warmup + iterations):
            policy.choose(requests[i % n], views)
        if iterations:
            best = min(best, (time.process_time() - t) / iterations * 1e6)
    return best if iterations else 0.0


# label -> (policy, session workload with prefix tracking, options)
ROWS: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "least_inflight": ("least_inflight", False, {}),
    "threshold": ("threshold", False, {}),
    "goodput/latency": ("goodput", False, {"objective": "latency"}),
    "goodput/throughput": ("goodput", False, {"objective": "throughput"}),
    "goodput/latency +prefix": ("goodput", True, {"objective": "latency"}),
    "goodput/throughput +prefix": ("goodput", True, {"objective": "throughput"}),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.choose", description=__doc__)
    ap.add_argument("--backends", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=20000, help="decisions measured per run")
    ap.add_argument("--warmup", type=int, default=0, help="decisions before measuring, in each run")
    ap.add_argument("--runs", type=int, default=3, help="runs, the best one reported")
    ap.add_argument("--only", action="append", choices=list(ROWS), help="this row only (repeatable)")
    args = ap.parse_args(argv)
    if args.backends < 1 or args.runs < 1 or args.iterations < 0 or args.warmup < 0:
        ap.error("--backends and --runs must be >= 1, --iterations and --warmup >= 0")
    for label in args.only or list(ROWS):
        name, sessions, opts = ROWS[label]
        us = bench_choose(
            name, args.backends, args.iterations, sessions=sessions, warmup=args.warmup, runs=args.runs, seed=0, **opts
        )
        print(f"{label:30s} {us:6.2f} us per choose ({args.backends} backends)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
