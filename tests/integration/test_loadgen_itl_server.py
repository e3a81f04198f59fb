"""The ITL target against a real twin process: loadgen's median per-token ITL agrees within 1% with
the one computed from the server's own step log (the rule, and the byte fixtures:
tests/unit/test_loadgen_itl.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_port, get_json, loadgen, running
from tests.unit.test_loadgen_itl import TOLERANCE, per_token_samples

SERVER = [
    "--chunk-pattern",
    "1,4,2,6,3,1,5,2",  # speculative steps of varying size
    "--chunk-delay",
    "0.004",
    "--reasoning-tokens",
    "17",  # thinking first: the </think> step writes no chunk
    "--speculative",
    "--log-steps",
]


def _run_loadgen(url: str, out: Path, *extra: str) -> dict:
    cmd = loadgen(
        "--target",
        url,
        "--concurrency",
        "3",
        "--num-prompts",
        "6",
        "--max-tokens",
        "64",
        "--dataset",
        "chat",
        "--save-chunks",
        "--output",
        str(out),
        "--no-plots",
        "--no-progress",
        *extra,
    )
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "summary.json").read_text())["runs"][0]["levels"][0]


def _server_reference(url: str, requests: list[dict]) -> list[float]:
    """Per-token samples from the server's step log, joined to loadgen's chunk arrival times by
    request id; the token counts are the server's, the times the client's."""
    steps = {s["request_id"]: s for s in get_json(f"{url}/steps")}
    samples: list[float] = []
    for r in requests:
        log = steps[r["request_id"]]
        arrivals = iter(r["chunk_times_ms"])
        times, since, prev = [], [], 0
        for cum, chunks in zip(log["tokens"], log["chunks"], strict=True):
            if chunks:
                t = next(arrivals)
                for _ in range(chunks - 1):  # the other chunks of the step came in the same write
                    next(arrivals)
                times.append(t)
                since.append(cum - prev)
                prev = cum
        assert next(arrivals, None) is None, "every client chunk belongs to a server step"
        samples += per_token_samples(times, since)
    return samples


def test_real_server_median_itl_matches_the_servers_own_counts(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "loadgen.testserver", "--port", str(port), *SERVER]
    with running(cmd, ready_url=f"{url}/health"):
        level = _run_loadgen(url, tmp_path / "exact")
        requests = [json.loads(x) for x in (tmp_path / "exact" / "requests.jsonl").read_text().splitlines()]
        ref = statistics.median(_server_reference(url, requests))
        assert level["completed"] == 6 and level["token_count_mismatches"] == 0
        assert level["itl_token_counts"] == "usage" and level["itl_exact_requests"] == 6
        assert level["median_itl_ms"] == pytest.approx(ref, rel=TOLERANCE)
        # every request thought first: 17 reasoning tokens plus the </think> token
        assert level["total_reasoning_tokens"] == 6 * 18 and level["reasoning_requests"] == 6

        fallback = _run_loadgen(url, tmp_path / "fallback", "--no-continuous-usage")
        assert fallback["itl_token_counts"] == "text_length" and fallback["itl_exact_requests"] == 0
        fb_requests = [json.loads(x) for x in (tmp_path / "fallback" / "requests.jsonl").read_text().splitlines()]
        assert {r["itl_token_counts"] for r in fb_requests} == {"text_length"}
