"""Virtual-clock drivers for the engine: closed-loop load in simulated time, no sleeping.

This is how curves and calibration run in seconds what takes minutes on the wall clock, and it
is the pattern the policy evaluator follows: advance a float clock by each step's duration.
Metrics follow the load generator's definitions (`docs/metrics.md`): per-request output
throughput = completion tokens / end-to-end latency; aggregate = all output tokens / duration.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from twin.engine import Engine
from twin.profile import Profile
from twin.text import count_prompt_tokens, render_chat

__all__ = ["LevelResult", "run_closed_loop", "DEFAULT_PROMPTS"]

DEFAULT_PROMPTS: dict[str, tuple[str, ...]] = {
    "math": (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "in May. How many clips did Natalia sell altogether in April and May? Solve step by step.",
        "A store sells pencils at 3 for $1. How much do 27 pencils cost? Calculate the answer.",
        "Solve the equation 3x + 7 = 22 and explain each step of the solution.",
        "What is the sum of the first 50 positive integers? Show how to compute it.",
    ),
    "code": (
        "Write a Python function that returns the longest palindromic substring of a string.",
        "Implement a binary search tree in Python with insert, delete and search methods.",
        "Fix the bug in this code: def add(a, b): return a - b",
        "Write a SQL query that returns the top 5 customers by total order value.",
    ),
    "chat": (
        "Tell me about the history of the city of Lyon and what a visitor should see there.",
        "What are some good ways to stay motivated when learning a new language?",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Describe your ideal weekend in the mountains.",
    ),
}


def _letters(n: int) -> str:
    """n in letters (a digit would tip a prompt toward the math domain)."""
    out = ""
    while True:
        n, r = divmod(n, 26)
        out = chr(ord("a") + r) + out
        if n == 0:
            return out


class LevelResult(msgspec.Struct, frozen=True):
    """One concurrency level of a closed-loop run, in simulated seconds."""

    concurrency: int
    completed: int
    duration_s: float
    total_output_tokens: int
    output_throughput: float  # aggregate tok/s
    mean_request_output_throughput: float  # per-request tok/s (tokens / e2e latency)
    mean_ttft_s: float
    mean_e2e_s: float
    accept_length: float  # mean over requests of completion_tokens / verify_ct (0 for AR)
    mean_step_s: float  # mean decode/verify step time over busy steps


def run_closed_loop(
    profile: Profile | Engine,
    concurrency: int,
    num_requests: int,
    max_new_tokens: int,
    prompts: Sequence[str] | None = None,
    seed: int = 0,
    domain: str | None = None,
    temperature: float = 0.0,
    prompt_tokens: int | None = None,
    distinct: bool = False,
) -> LevelResult:
    """Keep exactly `concurrency` requests in flight until `num_requests` finished.

    Prompts cycle through `prompts` (default: the domain's sample prompts, or all of them);
    `prompt_tokens` overrides their length (long-context runs), `temperature` their sampling.
    `distinct` numbers every request's prompt so that none repeats: an NGRAM server replays a
    greedy answer it gave before (`ngram.py`), which a sweep of a few sample prompts would
    otherwise measure instead of new text.
    """
    engine = profile if isinstance(profile, Engine) else Engine(profile, seed=seed)
    if prompts is None:
        prompts = DEFAULT_PROMPTS[domain] if domain else tuple(p for group in DEFAULT_PROMPTS.values() for p in group)
    now = 0.0
    issued = 0
    submitted: dict[str, float] = {}
    first: dict[str, float] = {}
    e2e: list[float] = []
    ttft: list[float] = []
    per_req_tps: list[float] = []
    accept: list[float] = []
    total_tokens = 0
    step_sum = 0.0
    steps = 0
    requests = {}

    def issue() -> None:
        nonlocal issued
        # Rendered like the server renders a one-message chat, so that the same prompt gets
        # the same per-request randomness here and over HTTP.
        prompt = prompts[issued % len(prompts)]
        text = render_chat([("user", f"{prompt} (variant {_letters(issued)})" if distinct else prompt)])
        rid = f"v{issued}"
        ntok = prompt_tokens if prompt_tokens is not None else count_prompt_tokens(text)
        requests[rid] = engine.submit(rid, ntok, max_new_tokens, text, domain=domain, temperature=temperature)
        submitted[rid] = now
        issued += 1

    for _ in range(min(concurrency, num_requests)):
        issue()
    while not engine.idle:
        res = engine.step()
        now += res.duration_s
        if res.batch_size:
            step_sum += engine.step_time(res.batch_size, kv_tokens=res.kv_tokens)
            steps += 1
        for em in res.emissions:
            if em.rid not in first:
                first[em.rid] = now
            if em.finished:
                req = requests.pop(em.rid)
                lat = now - submitted[em.rid]
                e2e.append(lat)
                ttft.append(first[em.rid] - submitted[em.rid])
                per_req_tps.append(req.completion_tokens / lat if lat > 0 else 0.0)
                total_tokens += req.completion_tokens
                if req.verify_ct:
                    accept.append(req.accept_length)
                if issued < num_requests:
                    issue()
    n = len(e2e)
    return LevelResult(
        concurrency=concurrency,
        completed=n,
        duration_s=now,
        total_output_tokens=total_tokens,
        output_throughput=total_tokens / now if now > 0 else 0.0,
        mean_request_output_throughput=sum(per_req_tps) / n if n else 0.0,
        mean_ttft_s=sum(ttft) / n if n else 0.0,
        mean_e2e_s=sum(e2e) / n if n else 0.0,
        accept_length=sum(accept) / len(accept) if accept else 0.0,
        mean_step_s=step_sum / steps if steps else 0.0,
    )
