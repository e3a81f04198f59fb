"""Routing decisions: the policy contract, the policies, the prompt-domain classifier."""

from policies.base import BackendView, Decision, Domain, NoCandidate, Outcome, Policy, RequestFeatures
from policies.domain import classify
from policies.registry import POLICY_NAMES, make_policy

__all__ = [
    "BackendView", "Decision", "Domain", "NoCandidate", "Outcome", "Policy", "RequestFeatures",
    "classify", "make_policy", "POLICY_NAMES",
]
