"""Trace files: Mooncake JSONL, Azure and BurstGPT CSV, windows and samples; bad input is refused
with the file and the line (the `loadgen` command's one line and exit 2:
tests/integration/test_loadgen_trace_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.trace_file import MAX_ROWS, TraceError, TraceSelection, parse_sample, parse_window, read_trace
from tests.support import TRACE_SLICE


def _mooncake(tmp_path: Path, rows: list[dict], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(ts: int, inp: int = 600, out: int = 10, ids: list[int] | None = None) -> dict:
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids or [0, ts + 1]}


def test_committed_mooncake_slice_reads_whole() -> None:
    t = read_trace(TRACE_SLICE)
    assert t.format == "mooncake" and len(t.rows) == 400
    assert t.rows[0].at_s == 0.0 and t.rows[-1].at_s == pytest.approx(141.0)
    assert all(b.at_s >= a.at_s for a, b in zip(t.rows, t.rows[1:], strict=False))
    assert all(len(r.blocks) == -(-r.input_tokens // 512) for r in t.rows)
    assert {r.blocks[0] for r in t.rows} == {0}  # every prompt starts with the same block


def test_window_rebases_offsets_and_keeps_the_gap_before_its_first_request(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_row(0), _row(1500), _row(4000), _row(9000)])
    t = read_trace(path, TraceSelection(start_s=1.0, seconds=5.0))
    assert [r.line for r in t.rows] == [2, 3]
    assert [r.at_s for r in t.rows] == [pytest.approx(0.5), pytest.approx(3.0)]
    assert t.window_s == 5.0
    t2 = read_trace(path, TraceSelection(start_s=1.0, seconds=5.0, speedup=2.0))
    assert t2.replay_s == 2.5 and t2.due_s(t2.rows[1]) == pytest.approx(1.5)


def test_sample_keeps_whole_conversations(tmp_path: Path) -> None:
    # two conversations: hash_ids[1] = 10 and 11; every request of one stays or goes together
    rows = [_row(i * 100, ids=[0, 10 + i % 2, 100 + i]) for i in range(8)]
    for r in rows:
        r["input_length"] = 1500
    t = read_trace(_mooncake(tmp_path, rows), TraceSelection(sample=(2, 1)))
    assert [r.blocks[1] for r in t.rows] == [11, 11, 11, 11]
    assert [r.line for r in t.rows] == [2, 4, 6, 8]


def test_rows_without_output_are_skipped_and_counted(tmp_path: Path) -> None:
    t = read_trace(_mooncake(tmp_path, [_row(0), _row(10, out=0), _row(20)]))
    assert [r.line for r in t.rows] == [1, 3] and sum(t.skipped.values()) == 1


def test_azure_csv_with_seven_fraction_digits(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.0297290,396,109\n"
        "2023-11-16 18:16:01.1805900,879,20\n"
    )
    t = read_trace(path)
    assert t.format == "azure"
    assert [r.at_s for r in t.rows] == [0.0, pytest.approx(3.349139), pytest.approx(14.5)]
    assert (t.rows[0].input_tokens, t.rows[0].output_tokens, t.rows[0].blocks) == (374, 44, ())


def test_burstgpt_csv_skips_failed_requests(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
    )
    t = read_trace(path)
    assert t.format == "burstgpt" and [r.at_s for r in t.rows] == [0.0, 113.0]
    assert sum(t.skipped.values()) == 1


@pytest.mark.parametrize(
    ("lines", "line", "words"),
    [
        ([_row(0), {"timestamp": 5, "input_length": 600, "hash_ids": [0, 1]}], 2, "missing column 'output_length'"),
        ([_row(0), _row(2000), _row(1000)], 3, "timestamp goes back"),
        ([_row(0), _row(5, inp=-3)], 2, "input_length -3 is negative"),
        ([_row(0), _row(5, out=-1)], 2, "output_length -1 is negative"),
        ([_row(0), _row(5, inp=2000, ids=[0, 1])], 2, "2 hash_ids for input_length 2000"),
        ([_row(0), {"timestamp": 5, "input_length": 600.5, "output_length": 1, "hash_ids": [0, 1]}], 2, "whole"),
    ],
)
def test_bad_mooncake_rows_name_their_line(tmp_path: Path, lines: list[dict], line: int, words: str) -> None:
    path = _mooncake(tmp_path, lines)
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert str(e.value).startswith(f"{path}:{line}: ") and words in str(e.value)
    assert "\n" not in str(e.value)


def test_truncated_mooncake_line_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    text = TRACE_SLICE.read_text().splitlines()
    path.write_text("\n".join(text[:5]) + "\n" + text[5][:40])  # the download stopped mid-line
    with pytest.raises(TraceError, match=rf"^{path}:6: not a complete JSON object .*truncated line\?$"):
        read_trace(path)


@pytest.mark.parametrize(
    ("csv", "line", "words"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n", 1, "missing column 'GeneratedTokens'"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,4\n2023-11-16 18:15:45.0,3,4\n",
            3,
            "timestamp goes back",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-374,4\n", 2, "is negative"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,4\n2023-11-16 18:15:47.1,37", 3, "trunc"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,374,4\n", 2, "not a date and time"),
    ],
)
def test_bad_azure_rows_name_their_line(tmp_path: Path, csv: str, line: int, words: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(csv)
    with pytest.raises(TraceError) as e:
        read_trace(path, TraceSelection(format="azure"))
    assert str(e.value).startswith(f"{path}:{line}: ") and words in str(e.value)


def test_unknown_format_and_empty_windows_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        read_trace(path)
    with pytest.raises(TraceError, match="no requests in the window 500:10"):
        read_trace(TRACE_SLICE, TraceSelection(start_s=500, seconds=10))
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")
    assert MAX_ROWS >= 100_000


def test_window_and_sample_syntax() -> None:
    assert parse_window("600:600") == (600.0, 600.0)
    assert parse_sample("2:0") == (2, 0)
    for bad in ("600", "a:b", "-1:5", "5:0"):
        with pytest.raises(TraceError, match="START:SECONDS"):
            parse_window(bad)
    for bad in ("2", "2:2", "0:0", "x:1"):
        with pytest.raises(TraceError, match="K:R"):
            parse_sample(bad)
