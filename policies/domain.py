"""Cheap prompt-domain classifier: math | code | chat, from keyword and symbol rules.

No model download and no tokenizer: it reads at most the last 2,000 characters of the prompt
(the user's latest turn is what the answer is about) and scores cue words and characters.

Rules (tested in tests/unit/test_policy_domain.py; the twin has its own, independent set: docs/twin.md):
- code: fenced code blocks, `def `/`class `/`function`/`#include`/`import `, words such as
  "python", "function", "implement", "compile", "bug", "regex", "sql" and bracket-heavy text;
- math: digits next to arithmetic operators, words such as "how many", "calculate", "solve",
  "equation", "percent", "total", "sum", "integral", "probability";
- math, too: ordinary word problems (ages, rates, travel, prices, work) that have no symbol or
  textbook word. They are told by their shape, not their topic: at least two numbers, plus a
  quantity question ("how old", "how long", "how far", "at what speed", "when will", "find the")
  or two quantity words (units, "per hour", "twice", "older", "discount", "each", "together");
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
# The same rules for ASCII text, matched on its lower-case copy without IGNORECASE and with the word
# boundary factored out of the alternatives: classify runs on every request, and these are several
# times faster than the patterns above on a long prompt (docs/performance.md). Non-ASCII text keeps
# the patterns above, whose Unicode case folding (e.g. U+017F for "s") this shortcut would not reproduce.
_CODE_ASCII = re.compile(
    r"```|#include|\b(?:def |class |function\b|import |python\b|javascript\b|rust\b|implement\b|compile|"
    r"bug\b|regex\b|sql\b|code\b|algorithm\b|return\b|stack trace\b)"
)
_MATH_ASCII = re.compile(
    r"\b(?:how many\b|how much\b|calculate\b|solve\b|equation\b|percent|total\b|sum\b|integral\b|"
    r"probability\b|derivative\b|average\b|remainder\b|prime\b|dollars?\b|cost\b|price\b)"
)


# Word problems: the shape of a quantitative question, on the lower-cased window.
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_QUANTITY_QUESTION = re.compile(
    r"\bhow (?:old|long|far|fast|many|much|soon|tall|heavy|often|big)\b|\bwhat time\b|"
    r"\bat what (?:speed|rate|time|price|age)\b|\bwhen will\b|\bfind (?:the|his|her|their|its|how)\b|"
    r"\bwork out\b|\bwhat (?:is|was|will be) (?:the|his|her|their|its) (?:age|speed|rate|cost|price|total|"
    r"average|area|volume|distance|time|profit|share|ratio|percentage|change)\b"
)
_QUANTITY_WORDS = re.compile(
    r"\b(?:years? old|older|younger|twice|half|thrice|triple|double|times as|per (?:hour|minute|second|day|week|"
    r"month|year|kg|kilogram|unit|item|piece|person)|mph|km/h|km|kilomet\w*|miles?|hours?|minutes?|seconds|litres?|"
    r"liters?|gallons?|kg|grams?|speed|rate|discount|profit|interest|salary|wages?|earns?|earned|spent|spends?|"
    r"costs?|each|together|alone|pipes?|tank|workers?|dozen|tickets?|ratio|shares?)\b"
)


def _word_problem(window: str) -> int:
    """2 when the window reads like a quantitative word problem, else 0."""
    lower = window.lower()
    if len(_NUMBER.findall(lower)) < 2:
        return 0
    if _QUANTITY_QUESTION.search(lower) or len(_QUANTITY_WORDS.findall(lower)) >= 2:
        return 2
    return 0


def _words(window: str) -> tuple[int, int]:
    """(code cue words, math cue words) in the window."""
    if window.isascii():
        lower = window.lower()
        return len(_CODE_ASCII.findall(lower)), len(_MATH_ASCII.findall(lower))
    return len(_CODE_WORDS.findall(window)), len(_MATH_WORDS.findall(window))


def classify(text: str) -> Domain:
    window = text[-_WINDOW:]
    code_words, math_words = _words(window)
    code = code_words + (window.count("{") + window.count(";")) // 4
    math = math_words + len(_ARITHMETIC.findall(window)) + _word_problem(window)
    if code and code >= math:
        return Domain.CODE
    if math >= 1:
        return Domain.MATH
    return Domain.CHAT
