"""The ITL target: loadgen's median per-token ITL agrees within 1% with a per-token
computation from exact usage counts.

The reference here never uses loadgen's token attribution: on the byte fixtures it takes the tokens
each server step produced from the scenario the stream was built from; against a real server
process it takes them from the server's own step log (`/steps`: per step, the cumulative tokens and
how many chunks it wrote), and only the arrival times from loadgen (`--save-chunks`). Rule: a step
that wrote chunks, after a gap g since the previous such step, with k tokens since then (chunk-less
steps such as `</think>` included), stands for k samples of g/k; the first such step adds none.
"""

from __future__ import annotations

import statistics

import pytest

from loadgen.metrics import measure, summarize
from loadgen.stream import StreamParser
from loadgen.summary import RequestRecord
from tests.fixtures.streams.replay import load

TOLERANCE = 0.01


def per_token_samples(times: list[float], tokens_since: list[int]) -> list[float]:
    """k copies of g/k per step after the first (times: arrival of each chunk-writing step)."""
    out: list[float] = []
    for i in range(1, len(times)):
        k = tokens_since[i]
        out += [(times[i] - times[i - 1]) / k] * k
    return out


def fixture_reference(truth: dict) -> list[float]:
    """Per-token samples from a fixture's scenario (ms)."""
    times, since, pending = [], [], 0
    for step in truth["steps"]:
        pending += step["tokens"]
        if step["generated_chunks"]:
            times.append(step["t_ms"])
            since.append(pending)
            pending = 0
    return per_token_samples(times, since)


def loadgen_median_ms(name: str) -> tuple[float | None, str | None]:
    """loadgen's parser and metrics on a fixture's bytes, each write at its time."""
    fx = load(name)
    parser = StreamParser()
    for t, data in fx.writes:
        parser.feed(data, t)
    end = fx.writes[-1][0]
    parser.close(end)
    rec = RequestRecord(index=0, target="t", max_concurrency=1, request_rate=None, domain="d", start_s=0.0, ok=True)
    gaps = measure(parser, t_send=0.0, t_end=end, streamed=True, record=rec)
    level = summarize([rec], gaps, duration=end, max_concurrency=1, request_rate=None, mode="closed")
    return level.median_itl_ms, level.itl_token_counts


@pytest.mark.parametrize(
    "name",
    [
        "thinking_continuous_usage",
        "thinking_boundary_continuous_usage",
        "tool_call",
        "plain_continuous_usage",
        "completions_continuous_usage",
    ],
)
def test_fixture_median_itl_matches_exact_counts(name: str) -> None:
    ref = statistics.median(fixture_reference(load(name).truth))
    median, source = loadgen_median_ms(name)
    assert source == "usage"
    assert median == pytest.approx(ref, rel=TOLERANCE)


def test_without_per_chunk_usage_the_fallback_misses_and_says_so() -> None:
    """The same thinking stream without continuous usage: the text-length split misplaces the
    `</think>` token and the multi-token steps; the summary names the fallback."""
    exact = statistics.median(fixture_reference(load("thinking_continuous_usage").truth))
    median, source = loadgen_median_ms("thinking")
    assert source == "text_length"
    assert median is not None and abs(median / exact - 1) > TOLERANCE


# --- a real server process ---------------------------------------------------------------------
