"""Load generation without a server: arrival schedules, datasets (random, JSONL, ShareGPT, mixed),
compare and the note under a capped open loop that fell behind (against the in-process
test server: tests/integration/test_loadgen_modes.py)."""

from __future__ import annotations

import io
import itertools
import json
import random
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from loadgen.datasets import DatasetError, RandomSpec, load_dataset
from loadgen.driver import arrival_offsets
from loadgen.report import compare, level_notes
from loadgen.summary import Level, Run, Summary


def test_arrival_schedule_depends_on_seed_only() -> None:
    a = list(itertools.islice(arrival_offsets(5.0, random.Random(1)), 5))
    b = list(itertools.islice(arrival_offsets(5.0, random.Random(1)), 5))
    c = list(itertools.islice(arrival_offsets(5.0, random.Random(2)), 5))
    assert a == b != c and a[0] == 0.0
    assert list(itertools.islice(arrival_offsets(float("inf"), random.Random(1)), 3)) == [0.0] * 3


def test_a_capped_open_loop_that_fell_behind_says_so_under_its_row() -> None:
    level = Level(
        max_concurrency=1, completed=30, failed=0, duration=10.0, total_output_tokens=0, output_throughput=0.0,
        request_throughput=3.0, mean_request_output_throughput=None, median_ttft_ms=40.0, p99_ttft_ms=50.0,
        mean_tpot_ms=None, median_itl_ms=None, mean_e2e_latency_ms=None, accept_length=None, backends={},
        mode="open", request_rate=6.0, mean_client_wait_ms=2100.0, p99_client_wait_ms=4900.0,
    )  # fmt: skip
    (note,) = [n for n in level_notes(level) if n.startswith("open loop")]
    assert "3.00 requests/s sent of 6/s asked" in note and "p99 4,900 ms" in note
    quiet = msgspec.structs.replace(level, p99_client_wait_ms=3.0, mean_client_wait_ms=1.0)
    assert not [n for n in level_notes(quiet) if n.startswith("open loop")]


def test_mixed_interleaves_domains() -> None:
    ds = load_dataset("mixed")
    assert [p.domain for p in ds.take(6)] == ["math", "code", "chat"] * 2
    assert {p.domain for p in ds.prompts} == {"math", "code", "chat"}
    assert len(load_dataset("math").prompts) >= 20


def test_random_dataset_lengths_and_seed() -> None:
    spec = RandomSpec(input_len=50, output_len=40, range_ratio=0.5, num_prompts=30)
    a, b = load_dataset("random", seed=1, random_spec=spec), load_dataset("random", seed=1, random_spec=spec)
    c = load_dataset("random", seed=2, random_spec=spec)
    assert a == b and a != c
    for p in a.prompts:
        assert 25 <= len(p.messages[0].content.split()) <= 50
        assert 20 <= (p.max_tokens or 0) <= 40


def test_jsonl_dataset(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"prompt": "hi", "domain": "chat"}\n\n"bare string"\n'
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", '
        '"content": "u"}], "max_tokens": 9}\n'
    )
    ds = load_dataset(f"jsonl:{f}")
    assert [p.domain for p in ds.prompts] == ["chat", "jsonl", "jsonl"]
    assert ds.prompts[2].max_tokens == 9 and ds.prompts[2].messages[0].role == "system"


@pytest.mark.parametrize(
    "body, where",
    [
        ('{"prompt": "ok"}\n{"prompt": "ok"}\n{"prompt": broken}\n', ":3:"),
        ('{"prompt": "ok"}\n{"nothing": 1}\n', ":2: expected a non-empty"),
        ('{"prompt": 5}\n', ":1:"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, body: str, where: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(body)
    with pytest.raises(DatasetError) as e:
        load_dataset(f"jsonl:{f}")
    assert where in str(e.value) and "\n" not in str(e.value)


def test_sharegpt_dataset_and_malformed_line(tmp_path: Path) -> None:
    good = tmp_path / "sg.json"
    good.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a"}]},
                {"conversations": [{"from": "gpt", "value": "no human"}]},
                {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q2"}]},
            ],
            indent=1,
        )
    )
    ds = load_dataset(f"sharegpt:{good}")
    assert [p.messages[-1].content for p in ds.prompts] == ["q1", "q2"]
    assert [m.role for m in ds.prompts[1].messages] == ["system", "user"]  # the leading system turn is kept
    assert {p.domain for p in ds.prompts} == {"sharegpt"}
    assert ds.skipped == {"no user turn": 1}
    bad = tmp_path / "bad.json"
    bad.write_text('[\n {"conversations": []},\n {"conversations": [}\n]\n')
    with pytest.raises(DatasetError) as e:
        load_dataset(f"sharegpt:{bad}")
    assert f"{bad}:3:" in str(e.value)


def _summary(target: str, agg: float, ttft: float) -> Summary:
    lv = Level(
        max_concurrency=4,
        completed=8,
        failed=0,
        duration=2.0,
        total_output_tokens=100,
        output_throughput=agg,
        request_throughput=4.0,
        mean_request_output_throughput=agg / 4,
        median_ttft_ms=ttft,
        p99_ttft_ms=ttft * 2,
        mean_tpot_ms=10.0,
        median_itl_ms=10.0,
        mean_e2e_latency_ms=500.0,
        accept_length=None,
        backends={},
    )
    return Summary(runs=[Run(target=target, url="http://x", dataset="mixed", levels=[lv])])


def test_compare_ratios(tmp_path: Path) -> None:
    a, b = _summary("k26-ar", 100.0, 50.0), _summary("k26-ar", 250.0, 25.0)
    (tmp_path / "a.json").write_bytes(msgspec.json.encode(a))
    console = Console(record=True, width=200, file=io.StringIO())
    (ratios,) = compare(tmp_path / "a.json", msgspec.to_builtins(b), console)
    assert ratios["output_throughput"] == pytest.approx(2.5)
    assert ratios["median_ttft_ms"] == pytest.approx(0.5)
    assert ratios["accept_length"] is None
    assert "2.500x" in console.export_text()
