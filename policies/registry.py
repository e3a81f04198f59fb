"""Policy construction by name, as written in the config."""

from __future__ import annotations

from policies.base import Policy
from policies.simple import LeastInflight, Pinned, RoundRobin

POLICY_NAMES = ("pinned", "round_robin", "least_inflight")


def make_policy(name: str, *, pinned_backend: str | None = None) -> Policy:
    if name == "least_inflight":
        return LeastInflight()
    if name == "round_robin":
        return RoundRobin()
    if name == "pinned":
        if not pinned_backend:
            raise ValueError("policy 'pinned' needs pinned_backend")
        return Pinned(pinned_backend)
    raise ValueError(f"unknown policy {name!r}, expected one of {list(POLICY_NAMES)}")
