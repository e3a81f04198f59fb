"""Bad trace input through the `loadgen` command: one line naming the file and the line, exit 2
(the trace files themselves: tests/unit/test_loadgen_trace_file.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import TRACE_SLICE, loadgen
from tests.unit.test_loadgen_trace_file import _mooncake, _row


def test_loadgen_refuses_a_bad_trace_with_one_line_and_exit_2(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_row(0), _row(2000), _row(1000)])
    p = subprocess.run(
        loadgen("--target", "http://127.0.0.1:9", "--dataset", f"trace:{path}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stderr.strip() == (
        f"loadgen: error: {path}:3: timestamp goes back (1000 ms after 2000 ms on line 2): a trace is in arrival order"
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--request-rate", "2"], "--request-rate with a trace"),
        (["--temperature", "0"], "--temperature with a trace"),
        (["--trace-window", "10"], "--trace-window '10': START:SECONDS"),
        (["--trace-speedup", "0"], "speed-up must be > 0"),
        (["--thinking-share", "1.5"], "--thinking-share must be within [0, 1]"),
    ],
)
def test_loadgen_refuses_options_a_trace_sets_itself(args: list[str], words: str) -> None:
    p = subprocess.run(
        loadgen("--target", "http://127.0.0.1:9", "--dataset", f"trace:{TRACE_SLICE}", *args),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_trace_options_need_a_trace() -> None:
    p = subprocess.run(
        loadgen("--target", "http://127.0.0.1:9", "--dataset", "math", "--trace-speedup", "2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--trace-speedup needs --dataset trace:PATH" in p.stderr
