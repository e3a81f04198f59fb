"""The gateway and loadgen time the same thinking stream alike (within 2%).

Both use `common.stream_clock`'s definition: TTFT to the first generated token of any kind (here
the first reasoning token), decode speed over first to last generated token. The gateway's clock
starts at the request's receipt, loadgen's at its send, and each reads a token when it arrives at
its end of the connection; what separates them is loopback transit and the gateway's own work,
which a realistic TTFT (a long prompt's prefill on the twin at real speed) makes small.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.support import free_port, gateway_config, loadgen, output, running, specroute

TOLERANCE = 0.02
# Long chat prompts (a few thousand tokens: most of a second of prefill on the twin at real speed),
# asking for more output than a chat prompt's reasoning usually takes: streams think, then answer.
HISTORY = (
    "The Roman republic began when the last king was expelled, and for five centuries its consuls, "
    "senate and assemblies shared power in a balance that observers such as Polybius admired. "
) * 120
# The question first: prompts that differ from their first token on, so the twin's prefix cache
# serves neither (a cached history would make the TTFT short and the comparison coarse).
PROMPTS = [
    f"Question {i}: in a few paragraphs, how did the balance of power described below change over time?\n{HISTORY}"
    for i in range(2)
]


def test_gateway_and_loadgen_agree_on_a_thinking_streams_ttft_and_decode_speed(tmp_path):
    twin_port, port = free_port(), free_port()
    twin = f"http://127.0.0.1:{twin_port}"
    config = tmp_path / "gateway.toml"
    config.write_text(gateway_config(port, [{"name": "d", "url": twin, "model": "kimi-k2.6", "strategy": "dflash"}]))
    out = tmp_path / "run"
    with (
        running(
            specroute(
                "sim",
                "--profile",
                "k26-dflash",
                "--port",
                str(twin_port),
                "--time-scale",
                "1",
                "--reasoning-parser",
                "kimi_k2",
            ),
            ready_url=f"{twin}/ready",
            timeout=60,
        ),
        running(specroute("serve", "--config", str(config)), ready_url=f"http://127.0.0.1:{port}/health") as gw,
    ):
        dataset = tmp_path / "long_chat.jsonl"
        dataset.write_text(
            "".join(json.dumps({"prompt": p, "max_tokens": 640, "domain": "chat"}) + "\n" for p in PROMPTS)
        )
        run = subprocess.run(
            loadgen(
                "--target",
                "gateway",
                "--gateway-url",
                f"http://127.0.0.1:{port}",
                "--dataset",
                f"jsonl:{dataset}",
                "--thinking",
                "on",
                "--num-prompts",
                "2",
                "--concurrency",
                "1",
                "--output",
                str(out),
                "--no-plots",
                "--no-progress",
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]

        def gateway_lines():
            return {
                r["request_id"]: r
                for r in (json.loads(line) for line in output(gw).splitlines() if line.startswith('{"ts"'))
            }

        assert len(rows) == 2 and all(r["ok"] for r in rows)
        (level,) = json.loads((out / "summary.json").read_text())["runs"][0]["levels"]
        assert level["itl_token_counts"] == "usage"  # SGLang's per-chunk usage passes through the gateway
        deadline = time.monotonic() + 10
        while not all(r["request_id"] in gateway_lines() for r in rows) and time.monotonic() < deadline:
            time.sleep(0.05)
        logged = gateway_lines()
    answered = []
    for row in rows:
        rec = logged[row["request_id"]]
        print(
            f"\n{row['request_id'][:8]}: TTFT gateway {rec['ttft_s'] * 1000:.1f} ms, loadgen {row['ttft_ms']:.1f} ms "
            f"({rec['ttft_s'] * 1000 / row['ttft_ms'] - 1:+.2%}); decode gateway {rec['decode_tok_s']:.1f} tok/s, "
            f"loadgen {row['decode_throughput']:.1f} ({rec['decode_tok_s'] / row['decode_throughput'] - 1:+.2%}); "
            f"{rec['reasoning_tokens']} of {rec['completion_tokens']} tokens reasoning"
        )
        assert row["thinking"] and rec["reasoning_tokens"] > 0 and row["reasoning_tokens"] == rec["reasoning_tokens"]
        assert row["ttft_reasoning_ms"] == pytest.approx(row["ttft_ms"])  # the clock started on a reasoning token
        assert rec["completion_tokens"] == row["output_tokens"]
        assert rec["ttft_s"] * 1000 == pytest.approx(row["ttft_ms"], rel=TOLERANCE), (rec, row)
        assert rec["decode_tok_s"] == pytest.approx(row["decode_throughput"], rel=TOLERANCE), (rec, row)
        if rec["reasoning_tokens"] < rec["completion_tokens"]:  # the answer came after the thinking
            assert rec["ttft_answer_s"] * 1000 == pytest.approx(row["ttft_answer_ms"], rel=TOLERANCE)
            answered.append(rec)
    assert answered, "no stream got past its reasoning: nothing shows the answer's clock"
