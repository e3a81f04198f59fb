"""Routing decisions: the policy contract, live estimates, the policies, the prompt-domain
classifier. The evaluation harness (`evaluate/`) is tooling outside the product."""

from policies.base import (
    BackendView,
    Decision,
    Describes,
    Domain,
    NoCandidate,
    Outcome,
    Policy,
    RequestFeatures,
    Resident,
    Seedable,
    TracksPrefixes,
    view_load,
)
from policies.domain import classify
from policies.estimates import BackendEstimate, Estimates
from policies.goodput import OBJECTIVES, Goodput
from policies.prefix import message_blocks, text_blocks
from policies.registry import DEFAULT_POLICY, POLICY_NAMES, make_policy
from policies.threshold import Threshold

__all__ = [
    "DEFAULT_POLICY",
    "OBJECTIVES",
    "POLICY_NAMES",
    "BackendEstimate",
    "BackendView",
    "Decision",
    "Describes",
    "Domain",
    "Estimates",
    "Goodput",
    "NoCandidate",
    "Outcome",
    "Policy",
    "RequestFeatures",
    "Resident",
    "Seedable",
    "Threshold",
    "TracksPrefixes",
    "classify",
    "make_policy",
    "message_blocks",
    "text_blocks",
    "view_load",
]
