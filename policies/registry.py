"""Policy construction by name, as written in the config.

Options are keyword arguments (`objective`, `threshold`, `seed`, ...); an option a policy does
not take is refused by name, so a typo in config fails at startup instead of being ignored. The
config (`gateway.config`) refuses a `[models."NAME"]` option that the model's policy does not take
the same way, naming the key and the policy; only with `gateway.allow_policy_header` does it keep an
option another policy a client may choose takes, for that policy.
"""

from __future__ import annotations

from typing import Any

from policies.base import Policy
from policies.goodput import Goodput
from policies.simple import LeastInflight, Pinned, RoundRobin
from policies.threshold import Threshold

POLICY_NAMES = ("pinned", "round_robin", "least_inflight", "threshold", "goodput")
DEFAULT_POLICY = "goodput"

POLICY_OPTIONS: dict[str, frozenset[str]] = {
    "pinned": frozenset({"pinned_backend"}),
    "round_robin": frozenset(),
    "least_inflight": frozenset({"seed"}),
    "threshold": frozenset({"threshold", "seed"}),
    "goodput": frozenset(
        {
            "objective",
            "seed",
            "epsilon",
            "explore_gap",
            "explore_floor",
            "bonus",
            "hysteresis",
            "externality",
            "ttft_weight",
            "ttft_slo_s",
            "tpot_slo_s",
            "slo_weight",
            "prefix_tracking",
            "backends",
        }
    ),
}


def make_policy(name: str, **options: Any) -> Policy:
    """Build policy `name`. Options set to None count as not given (config leaves them unset).

    pinned: pinned_backend (required). least_inflight: seed. threshold: threshold (default 16),
    seed. goodput: objective ("latency" | "throughput"), seed, epsilon, explore_gap,
    explore_floor, bonus, hysteresis, externality (weight of the time a request imposes on the
    others, 1.0; 0.0 = selfish), ttft_weight (seconds of TTFT counted as this many seconds of
    decode, 1.0), ttft_slo_s, tpot_slo_s and slo_weight (each predicted second of TTFT past
    ttft_slo_s, 5.0, or of decode beyond a pace of tpot_slo_s, 0.06 s a token, costs slo_weight
    more, 1.0), prefix_tracking (True) (see `policies.goodput`), backends
    (BackendSpecs to register before the first request).
    """
    if name not in POLICY_OPTIONS:
        raise ValueError(f"unknown policy {name!r}, expected one of {list(POLICY_NAMES)}")
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - POLICY_OPTIONS[name])
    if unknown:
        raise ValueError(f"policy {name!r} does not take option(s) {unknown}; it takes {sorted(POLICY_OPTIONS[name])}")
    if name == "least_inflight":
        import random

        return LeastInflight(random.Random(given["seed"]) if "seed" in given else None)
    if name == "round_robin":
        return RoundRobin()
    if name == "pinned":
        if not given.get("pinned_backend"):
            raise ValueError("policy 'pinned' needs pinned_backend")
        return Pinned(given["pinned_backend"])
    if name == "threshold":
        return Threshold(**given)
    return Goodput(**given)
