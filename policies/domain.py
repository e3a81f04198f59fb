"""Cheap prompt-domain classifier: math | code | chat, from keyword and symbol rules.

No model download and no tokenizer: it reads at most the last 2,000 characters of the prompt
(the user's latest turn is what the answer is about) and scores cue words and characters.

Rules (documented in the README and tested):
- code: fenced code blocks, `def `/`class `/`function`/`#include`/`import `, words such as
  "python", "function", "implement", "compile", "bug", "regex", "sql" and bracket-heavy text;
- math: digits next to arithmetic operators, words such as "how many", "calculate", "solve",
  "equation", "percent", "total", "sum", "integral", "probability";
- otherwise chat. Code wins ties with math: code prompts often contain numbers too.
"""

from __future__ import annotations

import re

from policies.base import Domain

_WINDOW = 2000
_CODE_WORDS = re.compile(
    r"```|\bdef |\bclass |\bfunction\b|#include|\bimport |\bpython\b|\bjavascript\b|\brust\b|"
    r"\bimplement\b|\bcompile|\bbug\b|\bregex\b|\bsql\b|\bcode\b|\balgorithm\b|\breturn\b|\bstack trace\b",
    re.IGNORECASE,
)
_MATH_WORDS = re.compile(
    r"\bhow many\b|\bhow much\b|\bcalculate\b|\bsolve\b|\bequation\b|\bpercent|\btotal\b|\bsum\b|"
    r"\bintegral\b|\bprobability\b|\bderivative\b|\baverage\b|\bremainder\b|\bprime\b|\bdollars?\b|"
    r"\bcost\b|\bprice\b",
    re.IGNORECASE,
)
_ARITHMETIC = re.compile(r"\d\s*[-+*/^=×÷]\s*\d|\$\d|\d+%")


def classify(text: str) -> Domain:
    window = text[-_WINDOW:]
    code = len(_CODE_WORDS.findall(window)) + (window.count("{") + window.count(";")) // 4
    math = len(_MATH_WORDS.findall(window)) + len(_ARITHMETIC.findall(window))
    if code and code >= math:
        return Domain.CODE
    if math >= 1:
        return Domain.MATH
    return Domain.CHAT
