"""The twin's own reading of a prompt: its domain (math | code | chat) and a per-prompt seed.

Acceptance in speculative decoding depends on what is being written (math and code are more
predictable than open chat), so the twin needs a domain per prompt. These rules are the twin's
own, deliberately independent of the gateway's classifier in `policies/`: the policy must learn
from what the backend *does*, not from sharing the backend's code.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["DOMAINS", "classify", "prompt_key", "prompt_variation"]

DOMAINS: tuple[str, ...] = ("math", "code", "chat")

_CODE = re.compile(
    r"```|\bdef |\bclass \w+\s*[:({]|\bimport |\breturn\b|\bfunction\b|\bpython\b|\bjavascript\b|"
    r"\bbash\b|\bscript\b|\bshell\b|\bgo\b func|\bjson\b|\bunit tests?\b|\brefactor|"
    r"\btypescript\b|\brust\b|\bjava\b|\bc\+\+|\bsql\b|\bcode\b|\bimplement\b|\bcompile|"
    r"\bbug\b|\bregex\b|\balgorithm\b|\bprogram\b|\bsnippet\b|\bapi\b|\(\)|;\s*$|\{\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_MATH = re.compile(
    r"\bsolve\b|\bcalculate\b|\bcompute\b|\bequation\b|\bhow many\b|\bhow much\b|\bsum\b|"
    r"\bproduct\b|\binteger\b|\bprove\b|\btheorem\b|\bprobability\b|\bderivative\b|\bintegral\b|"
    r"\bmath\b|\bdivid|\bmultipl|\bpercent|\bfraction\b|\bremainder\b|\d+\s*[-+*/^=]\s*\d+|\$\d|"
    r"\baverage\b|\bper hour\b|\btotal\b|\bratio\b|\bspeed\b|\barea\b|\bwidth\b|"
    r"\breasoning\b|\bstep by step\b|\bfinal answer\b",
    re.IGNORECASE,
)


_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")


def classify(text: str) -> str:
    """Domain of a prompt by keyword rules; code keywords weigh double (code prompts often
    contain numbers and words like "total").

    Several numbers in a prompt count as math evidence: word problems are mostly numbers.
    """
    code = 2 * len(_CODE.findall(text))  # code keywords are specific; numbers are not
    math = len(_MATH.findall(text)) + (2 if len(_NUMBER.findall(text)) >= 3 else 0)
    if code and code >= math:
        return "code"
    if math:
        return "math"
    return "chat"


def prompt_key(text: str) -> int:
    """Stable 64-bit hash of the prompt text (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def prompt_variation(key: int) -> float:
    """Deterministic per-prompt offset in [-1, 1], scaled by a profile's `prompt_spread`."""
    return ((key >> 11) / float(1 << 53)) * 2.0 - 1.0
