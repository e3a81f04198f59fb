"""Instructions per routing decision, counted by valgrind's callgrind: the decision cost as a figure
that does not move with the machine's load (`bench.choose` times the same decisions).

    python -m bench.decisions [--rows "goodput/latency,goodput/latency +prefix"] [--iterations 3000]

Each row of `bench.choose` runs twice under callgrind, in a fresh process: `--warmup` decisions
alone, then the same followed by `--iterations` more. The difference, divided by `--iterations`, is
the cost of one decision with the policy's state warm (the prefix tracker filled, the estimates
settled), start-up and warm-up excluded. Cache misses are not in it (docs/performance.md,
"Decision cost"). Needs valgrind (`apt install valgrind`); about 40 s per row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.callgrind import total_instructions
from bench.choose import ROWS

DEFAULT_ROWS = ("goodput/latency", "goodput/latency +prefix")


def count(row: str, backends: int = 16, iterations: int = 3000, warmup: int = 3000) -> int:
    """Instructions per decision of `bench.choose` row `row`."""
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (0, iterations):
            out = Path(tmp) / f"callgrind.{n}"
            bench = [sys.executable, "-m", "bench.choose", "--only", row, "--backends", str(backends)]
            bench += ["--warmup", str(warmup), "--iterations", str(n), "--runs", "1"]
            # a fixed hash seed: the two runs' start-up (imports, dict layouts) then costs the same, so
            # their difference is the decisions alone
            subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *bench],
                check=True,
                capture_output=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            totals.append(total_instructions(out))
    return (totals[1] - totals[0]) // iterations


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    p.add_argument("--backends", type=int, default=16)
    p.add_argument("--iterations", type=int, default=3000, help="counted decisions per row")
    p.add_argument("--warmup", type=int, default=3000, help="decisions before counting")
    a = p.parse_args(argv)
    rows = a.rows.split(",")
    if unknown := [r for r in rows if r not in ROWS]:
        p.error(f"unknown rows: {unknown} (known: {', '.join(ROWS)})")
    if a.iterations < 1 or a.warmup < 0 or a.backends < 1:
        p.error("--iterations and --backends must be >= 1, --warmup >= 0")
    if not shutil.which("valgrind"):
        print("bench.decisions needs valgrind (e.g. `apt install valgrind`)", file=sys.stderr)
        return 2
    for row in rows:
        print(f"{row:30s} {count(row, a.backends, a.iterations, a.warmup):10,d} instructions per decision", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
