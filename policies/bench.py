"""Micro-benchmark of `choose`: it runs for every request, so its cost is a feature.

    python -m policies.bench [--backends 16] [--iterations 20000]

Prints microseconds per decision for each policy on a pool of mixed strategies with varied
loads (not a test: timings depend on the machine and whoever else is using it). The goodput rows
run twice: on requests without a conversation prefix, and with prefix tracking on a session
workload (`_sessions`): every request carries the hash chain of its history, a system prompt
shared by all conversations plus its own turns, and the decision includes the lookup of every
candidate's cached depth and the recording of the chain on the chosen backend.
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

__all__ = ["bench_choose", "main"]


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
    policy_name: str = "goodput", backends: int = 16, iterations: int = 20000, sessions: bool = False, **options: Any
) -> float:
    """Mean CPU microseconds per `choose` over `iterations` decisions (best of 3 runs)."""
    rng = random.Random(0)
    views = _pool(backends, rng)
    requests = _sessions(rng) if sessions else _plain()
    best = float("inf")
    for _ in range(3):
        policy = make_policy(policy_name, **options)  # fresh: the prefix tracker starts empty each run
        t = time.process_time()  # CPU time: on a shared box, time descheduled is not the policy's
        n = len(requests)
        for i in range(iterations):
            policy.choose(requests[i % n], views)
        best = min(best, (time.process_time() - t) / iterations * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m policies.bench", description=__doc__)
    ap.add_argument("--backends", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=20000)
    args = ap.parse_args(argv)
    rows: list[tuple[str, bool, dict[str, Any]]] = [
        ("least_inflight", False, {}),
        ("threshold", False, {}),
        ("goodput", False, {"objective": "latency"}),
        ("goodput", False, {"objective": "throughput"}),
        ("goodput", True, {"objective": "latency"}),
        ("goodput", True, {"objective": "throughput"}),
    ]
    for name, sessions, opts in rows:
        us = bench_choose(name, args.backends, args.iterations, sessions=sessions, seed=0, **opts)
        label = name + (f"/{opts['objective']}" if opts else "") + (" +prefix" if sessions else "")
        print(f"{label:30s} {us:6.2f} us per choose ({args.backends} backends)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
