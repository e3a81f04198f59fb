"""Reading valgrind's callgrind output: the one figure the instruction benchmarks need from it.

Kept apart from `bench.instructions` (which drives gateways under callgrind) so that
`bench.decisions`, which counts policy decisions in a plain process, does not import the gateway
benchmark's machinery.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["total_instructions"]


def total_instructions(callgrind_out: Path) -> int:
    """The `Ir` total of a callgrind output file (its `summary:` or `totals:` line)."""
    total = None
    for line in callgrind_out.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
    if total is None:
        raise ValueError(f"{callgrind_out}: no summary or totals line")
    return total
