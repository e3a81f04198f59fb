"""Several seeds reported as one result: means of the figures, totals of the counts."""

import json

import pytest

from evaluate.cli import main
from evaluate.runner import run_scenario
from evaluate.seeds import merge_results, run_seeds
from tests.unit.test_eval import TINY

ONLY = ("goodput/latency", "least_inflight", "static/k26-dflash")


def test_merged_figures_are_the_means_and_counts_the_totals_of_the_seeds():
    runs = [run_scenario(TINY, seed=s, objectives=("latency",), only=ONLY) for s in (1, 2, 3)]
    merged = merge_results(runs)
    for i, ph in enumerate(merged.phases):
        for key, m in ph.policies.items():
            each = [r.phases[i].policies[key] for r in runs]
            assert m.mean_request_tok_s == pytest.approx(sum(e.mean_request_tok_s for e in each) / 3)
            assert m.p99_ttft_ms == pytest.approx(sum(e.p99_ttft_ms for e in each) / 3)
            assert m.clairvoyant_ratio == pytest.approx(sum(e.clairvoyant_ratio or 0.0 for e in each) / 3)
            assert m.requests == sum(e.requests for e in each)
            assert sum(m.backend_share.values()) == pytest.approx(1.0)
    # the seeds differ, so the mean is not any one of them
    assert len({r.phases[1].policies["goodput/latency"].mean_request_tok_s for r in runs}) == 3
    summary = merged.summary["goodput/latency"]["phase_mean_request_tok_s"]
    assert summary == pytest.approx(sum(r.summary["goodput/latency"]["phase_mean_request_tok_s"] for r in runs) / 3)
    assert merge_results(runs[:1]) is runs[0]


def test_run_seeds_in_worker_processes_equals_merging_the_single_runs():
    kwargs = {"objectives": ("latency",), "only": ONLY}
    parallel = run_seeds(TINY, [4, 5], jobs=2, **kwargs)
    serial = merge_results([run_scenario(TINY, seed=s, **kwargs) for s in (4, 5)])  # type: ignore[arg-type]
    assert [p.policies for p in parallel.phases] == [p.policies for p in serial.phases]


def test_results_that_do_not_match_are_refused():
    a = run_scenario(TINY, seed=1, objectives=("latency",), only=ONLY)
    b = run_scenario(TINY, seed=1, objectives=("latency",), only=("least_inflight",))
    with pytest.raises(ValueError, match="differ"):
        merge_results([a, b])
    with pytest.raises(ValueError, match="at least one"):
        merge_results([])


def test_cli_takes_a_seed_list_and_says_so(tmp_path, capsys):
    assert main(["--scenario", "steady-1", "--output", str(tmp_path), "--objective", "latency", "--seed", "0,1"]) == 0
    doc = json.loads((tmp_path / "eval.json").read_text())
    assert doc["seed"] == 0 and doc["seeds"] == [0, 1]
    assert "`specroute eval --seed 0,1`" in (tmp_path / "eval.md").read_text()
    capsys.readouterr()
    for bad in ("0,x", "1,1", ""):
        assert main(["--scenario", "steady-1", "--output", str(tmp_path), "--seed", bad]) == 2
        assert "--seed" in capsys.readouterr().err
