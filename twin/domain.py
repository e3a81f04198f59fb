"""The twin's own reading of a prompt: its domain (math | code | chat) and a per-prompt seed.

Acceptance in speculative decoding depends on what is being written (math and code are more
predictable than open chat), so the twin needs a domain per prompt. These rules are the twin's
own, deliberately independent of the gateway's classifier in `policies/`: the policy must learn
from what the backend *does*, not from sharing the backend's code.

Math is what asks for a computed answer: explicit math vocabulary (solve, equation, integral,
probability, ...) or an ordinary word problem, i.e. quantities (numbers, money, units) together
with a question or relation that needs arithmetic on them (how many / how much / how old / how
long / how far, total, each, per, twice, half, more than, older than, left, average, percent).
Ages, rates, travel, prices and work problems are math even without the word "solve". A number
alone does not make math ("Plan a 3-day trip"), nor does a question without quantities.
Code needs code vocabulary or code syntax and wins ties: code prompts often contain numbers; a
prompt that contains code to complete (a definition, a fence, a doctest) is code outright.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["DOMAINS", "classify", "prompt_key", "prompt_variation"]

DOMAINS: tuple[str, ...] = ("math", "code", "chat")

_FLAGS = re.IGNORECASE | re.MULTILINE

_CODE = re.compile(
    r"```|\bdef \w+\s*\(|\bclass \w+\s*[:({]|\bfrom [\w.]+ import\b|^\s*import \w+|>>> |\"\"\"|"
    r"\breturn\b|\bfunction\b|"
    r"\bpython\b|\bjavascript\b|\btypescript\b|\bbash\b|\bscript\b|\bshell\b|\bgolang\b|"
    r"\bjson\b|\bunit tests?\b|\brefactor|\brust\b|\bjava\b|\bc\+\+|\bsql\b|\bcode\b|"
    r"\bimplement\b|\bcompile|\bbug\b|\bregex\b|\balgorithm\b|\bprogram\b|\bsnippet\b|\bapi\b|"
    r"\bstack trace\b|\bexception\b|\bvariable\b|\barray\b|\bstring\b|\binteger overflow\b|"
    r"\w\(\)|;\s*$|\{\s*$|=>|->|\bfor \w+ in \b|\bwhile \(|\bconsole\.|\bprint\(",
    _FLAGS,
)
# code itself in the prompt (a definition to complete, a fence, a doctest): the answer is code
_CODE_SYNTAX = re.compile(
    r"```|\bdef \w+\s*\(|\bclass \w+\s*[:({]|\bfrom [\w.]+ import\b|>>> |"
    r"\bfunction \w+\s*\(|\bfunc \w+\s*\(|\bfn \w+\s*\(",
    _FLAGS,
)
# explicit mathematics: one of these is enough
_MATH_WORDS = re.compile(
    r"\bsolve\b|\bequation|\bcalculate\b|\bcompute\b|\bprove\b|\btheorem\b|\bprobability\b|"
    r"\bderivative\b|\bintegral\b|\bfactorial\b|\bprime (number|factor)|\bpolynomial\b|"
    r"\bremainder\b|\bfraction\b|\bmath\b|\barithmetic\b|\bgeometry\b|\balgebra\b|"
    r"\bsquare root\b|\bperimeter\b|\barea of\b|\bvolume of\b|\bdivisible\b|\bgcd\b|\blcm\b|"
    r"\d\s*[-+*/^×÷=]\s*\d|\b[xyn]\s*[-+*/^=]\s*\d|\bdigits?\b",
    _FLAGS,
)
# a question or relation that needs arithmetic on the quantities
_COMPUTE = re.compile(
    r"\bhow (many|much|old|long|far|fast|often)\b|\bwhat (is|was|will be) the (total|sum|"
    r"difference|product|average|cost|price|speed|distance|ratio|number)\b|\bin total\b|"
    r"\baltogether\b|\btotal\b|\beach\b|\bper\b|\bevery\b|\btwice\b|\bthrice\b|\bhalf\b|"
    r"\bdouble\b|\btriple\b|\btimes (as|more)\b|\b(more|less|fewer|older|younger|taller|"
    r"shorter|faster|slower|cheaper) than\b|\bleft\b|\bremain|\baverage\b|\bpercent|%|"
    r"\bdiscount\b|\binterest\b|\bprofit\b|\bshare[sd]? equally\b|\bsplit\b|\brate\b|"
    r"\bspeed\b|\bearn|\bspend|\bspent\b|\bsave[sd]?\b|\bcosts?\b|\bpays?\b|\bpaid\b|"
    r"\bfinish the (job|work)\b|\bworking together\b|\bwhen will\b|\bwhat time\b",
    _FLAGS,
)
_NUMBER = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?(?![\w.])|\b(one|two|three|four|five|six|seven|"
    r"eight|nine|ten|twelve|twenty|hundred|thousand|dozen)\b",
    _FLAGS,
)
_MONEY_UNITS = re.compile(
    r"[$€£¥]\s*\d|\b\d+(?:\.\d+)?\s*(dollars?|cents?|euros?|pounds?|yen|years? old|years?|"
    r"months?|weeks?|days?|hours?|minutes?|seconds?|miles?|km|kilometers?|meters?|feet|"
    r"inches|kg|kilograms?|grams?|pounds?|liters?|litres?|gallons?|mph|km/h|%)\b",
    _FLAGS,
)


def _math_score(text: str) -> int:
    explicit = len(_MATH_WORDS.findall(text))
    quantities = len(_NUMBER.findall(text)) + len(_MONEY_UNITS.findall(text))
    compute = len(_COMPUTE.findall(text))
    word_problem = quantities >= 1 and compute >= 1 and (quantities + compute) >= 3
    return 2 * explicit + (min(quantities, 4) + min(compute, 4) if word_problem else 0)


# What is being written is decided by the end of a conversation (the latest turns), and the rules'
# regexes cost time in proportion to what they read: a 140k-token prompt took 2.3 s of the twin's
# event loop. So they read its last WINDOW characters (about 2k tokens).
WINDOW = 8000


def classify(text: str) -> str:
    """Domain of a prompt by keyword rules (see the module docstring), on its last `WINDOW` characters."""
    text = text[-WINDOW:]
    if _CODE_SYNTAX.search(text):
        return "code"
    code = 2 * len(_CODE.findall(text))  # code vocabulary is specific; numbers are not
    math = _math_score(text)
    if code and code >= math:
        return "code"
    if math >= 2:
        return "math"
    return "chat"


def prompt_key(text: str) -> int:
    """Stable 64-bit hash of the prompt text (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def prompt_variation(key: int) -> float:
    """Deterministic per-prompt offset in [-1, 1], scaled by a profile's `prompt_spread`."""
    return ((key >> 11) / float(1 << 53)) * 2.0 - 1.0
