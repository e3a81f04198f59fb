"""A malformed dataset: loadgen, run against a server, names the file and line and sends nothing
(the datasets themselves: tests/unit/test_loadgen_datasets.py)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from loadgen.testserver import RunningServer, ServerConfig
from tests.support import loadgen


def test_malformed_dataset_sends_nothing(tmp_path: Path) -> None:
    """The CLI stops with exit 2 and one line before any request reaches the target."""
    f = tmp_path / "bad.json"
    f.write_text('[\n {"conversations": [{"from": "human", "value": "a"}]},\n {"conversations": 3}\n]\n')

    async def main() -> tuple[subprocess.CompletedProcess[str], int]:
        async with RunningServer(ServerConfig()) as srv:
            proc = await asyncio.create_subprocess_exec(
                *loadgen("--target", srv.url, "--dataset", f"sessions:{f}", "--no-progress"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode is not None
            done = subprocess.CompletedProcess([], proc.returncode, out.decode(), err.decode())
            return done, srv.stats.requests

    p, requests = asyncio.run(main())
    assert p.returncode == 2 and requests == 0
    assert f"{f}:3:" in p.stderr and "Traceback" not in p.stderr
