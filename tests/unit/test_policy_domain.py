"""The prompt-domain classifier on a labelled set of this test's own, kept apart from loadgen's
datasets and the twin's calibration prompts, with its confusion matrix.

The set leans on what the keyword rules used to miss: ordinary word problems (ages, rates, travel,
prices, work) with no symbol and no textbook word, and chat and code prompts that carry numbers.
"""

from __future__ import annotations

from collections import Counter

from policies import Domain, classify

M, C, T = Domain.MATH, Domain.CODE, Domain.CHAT

LABELLED: list[tuple[str, Domain]] = [
    # word problems: ages
    ("Maria is 4 years older than her brother. In 3 years their ages will add up to 31. How old is Maria now?", M),
    ("A father is 30 years older than his son; 5 years ago he was four times as old. What is the son's age?", M),
    ("Tom was 12 when his sister was born and she is 9 now. How old will Tom be when she turns 21?", M),
    ("Grandma is 7 times as old as Lily. If Lily is 9, in how many years will Grandma be 5 times her age?", M),
    # rates and work
    ("Two pipes fill a tank in 6 and 9 hours. Working together, how long do they take?", M),
    ("A printer makes 45 pages per minute. How long does it take to print 1,350 pages?", M),
    ("Three workers paint a fence in 8 hours. At the same rate, how long would 4 workers take?", M),
    ("Anna types 52 words per minute and Ben 38. Together, how many minutes for a 2,700-word essay?", M),
    ("A tap drips 3 drops a second; 20 drops make a millilitre. How much water is lost in a day?", M),
    # travel
    ("A cyclist rides 18 km at 12 km/h and then 10 km at 20 km/h. How long is the whole trip?", M),
    ("Two trains leave stations 300 miles apart at 1 pm, one at 70 mph and one at 80 mph. When will they meet?", M),
    ("A plane flies 2,400 km in 3 hours against the wind and returns in 2.5 hours. Find the wind speed.", M),
    ("Leaving at 7:40 and walking 5 km to school at 4 km an hour, what time does Jo arrive?", M),
    # prices
    ("A jacket costs 80 after a 20% discount. What was its original price?", M),
    (
        "Pencils are sold at 3 for 1.20 and erasers at 0.45 each. Sam buys 12 pencils and 4 erasers; what does he pay?",
        M,
    ),
    ("A shop buys shirts at 14 each and sells them at 21. How many must it sell to make a profit of 700?", M),
    (
        "Tickets cost 12 for adults and 7 for children. A family of 2 adults and 3 children pays with a 50 note. "
        "What change do they get?",
        M,
    ),
    # textbook math
    ("Solve 3x + 7 = 22 for x.", M),
    ("What is the derivative of x^3 - 4x?", M),
    ("Calculate the probability of rolling two sixes with two dice.", M),
    ("Is 221 a prime number?", M),
    ("Compute the integral of sin(x) from 0 to pi.", M),
    # code
    ("Write a Python function that checks whether a string is a palindrome.", C),
    ("Why does this JavaScript code print undefined? const x = obj.value; console.log(x);", C),
    ("Implement binary search in Rust over a sorted slice of 32-bit integers.", C),
    ("Fix the bug: for (int i = 0; i <= 10; i++) { arr[i] = i * 2; } crashes with 10 elements.", C),
    ("Write an SQL query that returns the 5 customers with the highest total orders in 2023.", C),
    ("How do I read a 2 GB CSV file in pandas without running out of memory? Show the code.", C),
    ("Refactor this class so the constructor takes 3 arguments instead of 7.", C),
    ("```python\ndef add(a, b):\n    return a - b\n```\nWhat is wrong here?", C),
    ("Explain what this regex matches: ^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$", C),
    ("Write a bash script that deletes log files older than 30 days, using find.", C),
    ("My Go program panics with index out of range [5] with length 5. The code loops over a slice.", C),
    ("Implement an LRU cache class with get and put in O(1).", C),
    # chat, some with numbers
    ("What are some good books for a 10 year old who loves dragons?", T),
    ("Tell me about the history of the Roman Empire between 27 BC and 476 AD.", T),
    ("Write a short poem about autumn leaves.", T),
    ("I have 2 interviews next week. Any tips to stay calm?", T),
    ("Plan a 3 day trip to Lisbon with museums and good food.", T),
    ("What is the difference between a crocodile and an alligator?", T),
    ("Summarise the plot of Pride and Prejudice in 5 sentences.", T),
    ("Can you suggest a name for my new puppy? She is a 2 month old beagle.", T),
    ("Why is the sky blue?", T),
    ("Give me 3 ideas for a birthday party for my mother, who turns 60.", T),
    ("How should I prepare for my first marathon in 4 months?", T),
    ("Translate 'good morning, how are you' into Spanish and French.", T),
    ("Who won the football World Cup in 1998 and 2018?", T),
    ("Describe the taste of a ripe mango to someone who has never had one.", T),
]


def _confusion() -> dict[tuple[Domain, Domain], int]:
    return dict(Counter((truth, classify(text)) for text, truth in LABELLED))


def test_confusion_matrix_on_a_labelled_set_of_our_own() -> None:
    matrix = _confusion()
    order = (M, C, T)
    lines = ["truth \\ said  " + "  ".join(f"{d.value:>5s}" for d in order)]
    lines += [f"{t.value:>12s}  " + "  ".join(f"{matrix.get((t, d), 0):5d}" for d in order) for t in order]
    print("\n" + "\n".join(lines))
    total = len(LABELLED)
    right = sum(matrix.get((d, d), 0) for d in order)
    word_problems = [text for text, truth in LABELLED[:17]]  # ages, rates, travel, prices
    assert all(truth is M for _, truth in LABELLED[:17])
    assert sum(classify(t) is M for t in word_problems) >= 16  # the rules used to read most of these as chat
    assert right / total >= 0.9, lines
    assert matrix.get((T, M), 0) <= 2  # numbers alone do not make a chat prompt math
    assert matrix.get((C, M), 0) <= 1  # nor a code prompt


def test_numbers_without_a_quantity_question_stay_chat() -> None:
    assert classify("We met in 1999 and married in 2004, a lovely story I want to write down.") is T
    assert classify("My flat is on floor 3 of 12, is it too noisy for a baby?") is T
