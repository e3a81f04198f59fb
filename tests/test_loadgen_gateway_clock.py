"""One clock for the gateway and loadgen: on thinking streams through the
gateway, the gateway's TTFT and decode tok/s (its access log) agree with loadgen's on the same
request (requests.jsonl, joined by `x-request-id`) within 2%.

The twin runs at real timing: the two TTFTs start at different places (loadgen's send, the
gateway's receipt), so their gap is the gateway's own time before the first token, and only a
realistic TTFT (a long prompt's prefill on K2.6) makes 2% a statement about the definition rather
than about a 50x-compressed clock. Three measured requests after one warmup, about 10 s.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from tests.support import free_port, loadgen, output, running, specroute

TOLERANCE = 0.02


def _access_log(text: str) -> dict[str, dict]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "request_id" in rec and "ttft_s" in rec:
                out[rec["request_id"]] = rec
    return out


def test_gateway_and_loadgen_time_a_thinking_stream_alike(tmp_path: Path) -> None:
    twin_port, gw_port = free_port(), free_port()
    twin = specroute("sim", "--profile", "k26-dflash", "--port", str(twin_port), "--reasoning-parser", "kimi_k2")
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[gateway]\nlisten = "127.0.0.1:{gw_port}"\n\n[[backends]]\nname = "k26-dflash"\n'
        f'url = "http://127.0.0.1:{twin_port}"\nmodel = "kimi-k2.6"\nstrategy = "dflash"\n'
    )
    gw_url = f"http://127.0.0.1:{gw_port}"
    with (
        running(twin, ready_url=f"http://127.0.0.1:{twin_port}/ready", timeout=60),
        running(
            specroute("serve", "--config", str(config)),
            ready_url=f"{gw_url}/health",
            timeout=60,
            env={"SPECROUTE_MEASURE_BACKENDS": "0"},
        ) as gw,
    ):
        out = tmp_path / "lg"
        p = subprocess.run(
            loadgen(
                "--target",
                "gateway",
                "--gateway-url",
                gw_url,
                "--concurrency",
                "1",
                "--num-prompts",
                "3",
                "--warmup",
                "1",
                "--dataset",
                "random",
                "--random-input-len",
                "2000",
                "--random-output-len",
                "160",
                "--output",
                str(out),
                "--no-plots",
                "--no-progress",
            ),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert p.returncode == 0, p.stderr
        logged = _access_log(output(gw))
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 3
    level = json.loads((out / "summary.json").read_text())["runs"][0]["levels"][0]
    assert level["itl_token_counts"] == "usage"  # per-chunk usage passes through the gateway
    ttft, decode = [], []
    for r in records:
        g = logged[r["request_id"]]
        # a thinking stream: its first token is reasoning, and both clocks start timing there
        assert r["reasoning_tokens"] and g["reasoning_tokens"] == r["reasoning_tokens"]
        assert r["ttft_reasoning_ms"] == r["ttft_ms"]
        assert g["completion_tokens"] == r["output_tokens"]
        ttft.append(r["ttft_ms"] / (g["ttft_s"] * 1000) - 1)
        decode.append(r["decode_throughput"] / g["decode_tok_s"] - 1)
    assert all(t >= -0.005 for t in ttft)  # loadgen's clock starts first (its send precedes receipt)
    assert abs(statistics.median(ttft)) <= TOLERANCE, ttft
    assert abs(statistics.median(decode)) <= TOLERANCE, decode
