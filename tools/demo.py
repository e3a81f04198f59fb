"""`specroute demo`: the embedded topology end to end, then everything is shut down.

Starts `specroute serve --twins` (one twin per seed system, the gateway over them) on a free port,
waits until it is ready, runs loadgen through the gateway and straight to each backend, and lets
loadgen print the side-by-side table. Children die with the demo, also on Ctrl-C or failure.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.processes import ProcessGroup, free_port, specroute_cmd, wait_measured
from tools.topology import SEED_SYSTEMS


def demo(
    concurrency: str,
    max_tokens: int,
    sim_time_scale: float | None,
    output: str | None,
    level_s: float,
) -> int:
    out_dir = Path(output or tempfile.mkdtemp(prefix="specroute-demo-"))
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with ProcessGroup() as group:
        cmd = specroute_cmd("serve", "--twins", "--listen", f"127.0.0.1:{port}")
        if sim_time_scale is not None:
            cmd += ["--sim-time-scale", str(sim_time_scale)]
        print(f"starting the gateway and {len(SEED_SYSTEMS)} twin backends ...", flush=True)
        log_path = out_dir / "gateway.log"  # the access log and twins' output, kept off the table
        out_dir.mkdir(parents=True, exist_ok=True)
        group.start("gateway", cmd, log_file=log_path)
        group.wait_ready({"gateway": f"{gateway_url}/health"}, timeout_s=90)
        wait_measured(
            gateway_url, timeout_s=30
        )  # the sweep starts after the startup measurement, as traffic after a deploy
        # the gateway against the backends of the model it serves (a seed system of another model
        # answers other requests: it is no alternative to the gateway's pool)
        served = SEED_SYSTEMS[0].model
        targets = ",".join(["gateway", *(s.name for s in SEED_SYSTEMS if s.model == served)])
        print(f"ready in {time.monotonic() - started:.1f}s; sweeping C={concurrency} on {targets}", flush=True)
        loadgen = [
            sys.executable,
            "-m",
            "loadgen",
            "--gateway-url",
            gateway_url,
            "--target",
            targets,
            "--concurrency",
            concurrency,
            "--max-tokens",
            str(max_tokens),
            "--duration",
            str(level_s),
            "--dataset",
            "mixed",
            "--output",
            str(out_dir),
        ]
        code = subprocess.call(loadgen)
    print(f"demo finished in {time.monotonic() - started:.0f}s; outputs and gateway.log in {out_dir}", flush=True)
    return code
