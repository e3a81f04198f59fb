"""The classifier's ASCII shortcut counts cue words exactly as the reference (IGNORECASE) patterns do."""

from __future__ import annotations

import random

from policies import domain


def _reference(window: str) -> tuple[int, int]:
    return len(domain._CODE_WORDS.findall(window)), len(domain._MATH_WORDS.findall(window))


_TOKENS = [
    "def ",
    "class ",
    "function",
    "import ",
    "python",
    "javascript",
    "rust",
    "implement",
    "compile",
    "compiler",
    "bug",
    "bugs",
    "regex",
    "sql",
    "code",
    "codes",
    "algorithm",
    "return",
    "stack trace",
    "stack  trace",
    "how many",
    "how much",
    "calculate",
    "solve",
    "equation",
    "percent",
    "percentage",
    "total",
    "sum",
    "summary",
    "integral",
    "probability",
    "derivative",
    "average",
    "remainder",
    "prime",
    "dollar",
    "dollars",
    "cost",
    "price",
    "```",
    "#include",
    "_def ",
    "xdef ",
    "Def ",
    "DEF ",
    "PYTHON",
    "How Many",
    "a",
    "the",
    " ",
    "\n",
    "_",
    "1",
    "+",
    "=",
    "{",
    ";",
    "é",
    "ſql",
    "K",
    "İ",
    "ı",
]


def test_ascii_shortcut_matches_reference_patterns():
    rng = random.Random(7)
    for _ in range(20000):
        window = "".join(
            rng.choice(_TOKENS) + rng.choice(["", " ", "_", "x", ".", "\n", "9"]) for _ in range(rng.randint(0, 30))
        )
        assert domain._words(window) == _reference(window), window
