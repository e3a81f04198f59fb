"""The decision micro-benchmark (`python -m bench.choose`) and its instruction count
(`python -m bench.decisions`): rows, refusals, and a real count under callgrind."""

from __future__ import annotations

import shutil

import pytest

from bench import choose as bench
from bench import decisions


def test_one_row_is_timed_and_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--only", "goodput/latency +prefix", "--iterations", "40", "--warmup", "20", "--runs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("goodput/latency +prefix")
    assert float(lines[0].split()[2]) > 0


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as unknown:
        bench.main(["--only", "goodput/fastest"])
    assert unknown.value.code == 2 and "goodput/fastest" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--runs", "0"])
    assert "--runs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        decisions.main(["--rows", "goodput/latency,goodput/fastest"])
    assert "unknown rows: ['goodput/fastest']" in capsys.readouterr().err


def test_the_count_says_what_it_needs_without_valgrind(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert decisions.main(["--rows", "least_inflight"]) == 2
    assert "needs valgrind" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_are_counted_under_callgrind() -> None:
    # the count is the difference of two runs: with the decisions counted, it must come out positive
    assert decisions.count("least_inflight", backends=4, iterations=50, warmup=10) > 0
