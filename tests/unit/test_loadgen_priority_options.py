"""`loadgen --priority` without a server: the option's mix, the body carrying the field only when
asked, a dataset line's own priority, the time-scale rule of every breakdown field, the report and
`loadgen compare` (the runs: tests/integration/test_loadgen_priority.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from loadgen import timescale
from loadgen.cli import build_parser, main, plan_from_args
from loadgen.client import RequestOptions, Target, build_body
from loadgen.datasets import DatasetError, Message, Prompt, load_dataset
from loadgen.report import compare, print_level, print_table
from loadgen.summary import Level, PriorityLevel, RequestRecord, Run, Summary

TARGET = Target(label="t", url="http://h", model="m")


PROMPT = Prompt(messages=(Message("user", "hi"),), domain="chat")


def _body(opts: RequestOptions, prompt: Prompt = PROMPT, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(build_body(TARGET, prompt, opts, **kw))
    return out


@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses"])
def test_the_body_carries_priority_only_when_asked(endpoint: str) -> None:
    plain = RequestOptions(endpoint=endpoint, max_tokens=8)
    raw = build_body(TARGET, PROMPT, plain)
    assert b"priority" not in raw  # without the option the body is as it always was
    # an empty mix is no mix: the very same bytes
    assert build_body(TARGET, PROMPT, msgspec.structs.replace(plain, priorities=())) == raw
    with_priority = _body(msgspec.structs.replace(plain, priorities=(7,)))
    assert with_priority.pop("priority") == 7
    assert with_priority == json.loads(raw)  # and nothing else changes
    assert _body(msgspec.structs.replace(plain, priorities=(-3,)))["priority"] == -3


def test_a_chained_responses_turn_carries_it_too() -> None:
    opts = RequestOptions(endpoint="responses", max_tokens=8, chain_responses=True, priorities=(4,))
    body = _body(opts, store=True, previous_response_id="resp_1")
    assert (body["priority"], body["store"], body["previous_response_id"]) == (4, True, "resp_1")


def test_a_dataset_lines_priority_wins(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": "a", "priority": 9}) + "\n" + json.dumps({"prompt": "b"}) + "\n",
    )
    own, plain = load_dataset(f"jsonl:{path}").prompts
    opts = RequestOptions(priorities=(1,))
    assert _body(opts, own)["priority"] == 9 and _body(opts, plain)["priority"] == 1
    assert _body(RequestOptions(), own)["priority"] == 9  # even without --priority
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}], "priority": 2}) + "\n")
    (session,) = load_dataset(f"sessions:{sessions}").sessions
    assert session.priority == 2


@pytest.mark.parametrize("bad", ["1.5", '"high"', "true", str(1 << 63)])
def test_a_dataset_lines_bad_priority_names_the_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "priority": ' + bad + "}\n")
    with pytest.raises(DatasetError, match=r"p\.jsonl:2:.*priority"):
        load_dataset(f"jsonl:{path}")


def test_the_option_parses_a_mix_and_defaults_to_none() -> None:
    def opts(*argv: str) -> RequestOptions:
        return plan_from_args(build_parser().parse_args(["--dataset", "chat", *argv])).opts

    assert opts().priorities == ()
    assert opts("--priority", "0,0,0,10").priorities == (0, 0, 0, 10)
    assert opts("--priority", "5").priorities == (5,)
    assert opts("--priority", "-2").priorities == (-2,)
    assert opts("--priority=-2,+3").priorities == (-2, 3)


@pytest.mark.parametrize("bad", ["x", "0,,1", "1_0", " 3", str(1 << 63)])
def test_a_bad_priority_exits_2_naming_it(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--priority", bad, "--target", "http://127.0.0.1:9"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("loadgen: error: argument --priority:") and bad in last


def test_every_priority_field_has_a_time_scale_rule() -> None:
    assert timescale.unclassified(PriorityLevel) == set()
    assert timescale.unclassified(Level) == set()
    assert timescale.unclassified(RequestRecord) == set()


def _level_with(by_priority: list[PriorityLevel]) -> Level:
    return Level(
        max_concurrency=6,
        completed=sum(p.completed for p in by_priority),
        failed=0,
        duration=1.0,
        total_output_tokens=100,
        output_throughput=100.0,
        request_throughput=10.0,
        mean_request_output_throughput=50.0,
        median_ttft_ms=20.0,
        p99_ttft_ms=90.0,
        mean_tpot_ms=1.0,
        median_itl_ms=1.0,
        mean_e2e_latency_ms=30.0,
        accept_length=None,
        backends={},
        priorities={str(p.priority): p.completed for p in by_priority},
        by_priority=by_priority,
    )


CLASSES = [
    PriorityLevel(priority=0, completed=3, failed=0, median_ttft_ms=812.5, p99_ttft_ms=990.0),
    PriorityLevel(priority=10, completed=3, failed=0, median_ttft_ms=123.4, p99_ttft_ms=150.0),
]


def _printed(fn: Any, *args: Any) -> str:
    console = Console(record=True, width=200)
    fn(*args, console)
    return console.export_text()


def test_the_report_shows_the_classes_only_when_sent() -> None:
    run = Run(target="gateway", url="http://x", dataset="chat", levels=[_level_with(CLASSES)])
    for text in (_printed(print_level, run, run.levels[0]), _printed(print_table, Summary(runs=[run]))):
        assert "per priority" in text and "812.5" in text and "123.4" in text
    plain = Run(target="gateway", url="http://x", dataset="chat", levels=[_level_with([])])
    for text in (_printed(print_level, plain, plain.levels[0]), _printed(print_table, Summary(runs=[plain]))):
        assert "priority" not in text


def test_compare_reads_summaries_with_and_without_the_breakdown() -> None:
    with_classes = Summary(runs=[Run(target="g", url="u", dataset="chat", levels=[_level_with(CLASSES)])])
    # a summary.json written before the fields existed
    old_level = {
        k: v for k, v in msgspec.to_builtins(_level_with([])).items() if k not in ("priorities", "by_priority")
    }
    without = {"runs": [{"target": "g", "url": "u", "dataset": "chat", "levels": [old_level]}]}
    (ratios,) = compare(without, with_classes, Console(record=True, width=200))
    assert ratios["median_ttft_ms"] == 1.0
