"""Micro-benchmark of `choose`: it runs for every request, so its cost is a feature.

    python -m policies.bench [--backends 16] [--iterations 20000]

Prints microseconds per decision for each policy on a pool of mixed strategies with varied
loads (not a test: timings depend on the machine and whoever else is using it).
"""

from __future__ import annotations

import argparse
import random
import time

from backends import BackendSpec, Strategy
from policies.base import BackendView, Domain, RequestFeatures
from policies.registry import make_policy

__all__ = ["bench_choose", "main"]


def _pool(n: int, rng: random.Random) -> list[BackendView]:
    strategies = list(Strategy)
    return [BackendView(spec=BackendSpec(name=f"b{i}", url="http://x", model="m",
                                         strategy=strategies[i % len(strategies)]),
                        inflight=rng.randrange(0, 40), reported_running=rng.randrange(0, 40),
                        reported_waiting=0, max_running=48)
            for i in range(n)]


def bench_choose(policy_name: str = "goodput", backends: int = 16, iterations: int = 20000,
                 **options) -> float:
    """Mean microseconds per `choose` over `iterations` decisions (best of 3 runs)."""
    rng = random.Random(0)
    policy = make_policy(policy_name, **options)
    views = _pool(backends, rng)
    requests = [RequestFeatures(model="m", domain=d) for d in Domain]
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for i in range(iterations):
            policy.choose(requests[i % 3], views)
        best = min(best, (time.perf_counter() - t) / iterations * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m policies.bench", description=__doc__)
    ap.add_argument("--backends", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=20000)
    args = ap.parse_args(argv)
    for name, opts in (("least_inflight", {}), ("threshold", {}),
                       ("goodput", {"objective": "latency"}),
                       ("goodput", {"objective": "throughput"})):
        us = bench_choose(name, args.backends, args.iterations, seed=0, **opts)
        label = name + (f"/{opts['objective']}" if opts else "")
        print(f"{label:22s} {us:6.2f} us per choose ({args.backends} backends)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
