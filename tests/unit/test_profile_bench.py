"""The profile-fit benches' own parts: the perturbed truth and the plan comparison."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import msgspec

from bench import profile_plan
from bench.perturbed_profile import FACTORS, write_perturbed
from twin.profile import load_profile

BUNDLED = Path(__file__).resolve().parents[2] / "twin" / "profiles"


def test_a_perturbed_profile_moves_every_parameter_it_names(tmp_path):
    path = write_perturbed("k26-dflash", tmp_path)
    base, moved = load_profile("k26-dflash"), load_profile(str(path))
    assert moved.name == "k26-dflash-perturbed" and moved.strategy == base.strategy
    raw_base = tomllib.loads((BUNDLED / "k26-dflash.toml").read_text())
    raw_moved = tomllib.loads(path.read_text())
    changed = 0
    for dotted, factor in FACTORS.items():
        table, _, key = dotted.partition(".")
        if key not in raw_base.get(table, {}):
            continue
        old, new = raw_base[table][key], raw_moved[table][key]
        assert abs(new / old - factor) < 0.02, (dotted, old, new)
        assert raw_moved["provenance"][dotted].startswith("design: k26-dflash's"), dotted
        changed += 1
    assert changed >= 20
    # what it does not name stays as it was
    assert moved.max_running_requests == base.max_running_requests and moved.speculative is not None
    assert base.speculative is not None and moved.speculative.dflash_block_size == base.speculative.dflash_block_size


def test_a_perturbed_acceptance_stays_a_probability(tmp_path):
    raw = tomllib.loads(write_perturbed("qwen36-ddtree-b15", tmp_path).read_text())
    assert all(0 < raw["acceptance"][d] < 1 for d in ("math", "code", "chat"))


def test_plan_comparison_of_a_set_with_itself_is_the_same_pick(tmp_path, capsys):
    fitted = tmp_path / "fitted"
    fitted.mkdir()
    for name in profile_plan.SETS["qwen36"][0]:
        shutil.copy(BUNDLED / f"{name}.toml", fitted / f"{name}.toml")
    out = tmp_path / "plan.json"
    argv = ["--fitted", str(fitted), "--truths", str(tmp_path / "none"), "--servers", "2", "--sample-s", "20"]
    argv += ["--seeds", "0,1"]  # scores on the true profiles: a mean over two seeds
    code = profile_plan.main([*argv, "--sets", "qwen36", "--jobs", "1", "--output", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    (row,) = msgspec.json.decode(out.read_bytes(), type=list[profile_plan.Comparison])
    assert row.fitted_pick == row.true_pick and "/" not in row.true_pick
    assert row.fitted_pick_on_true == row.true_score and row.ratio == 1.0
    assert "targets: all met" in printed


def test_plan_comparison_misses_when_the_fitted_pick_scores_low():
    row = profile_plan.Comparison(
        set="k26",
        servers=4,
        traffic="day",
        true_pick="4xk26-dflash",
        true_score=100.0,
        fitted_pick="4xk26-ar",
        fitted_score_on_fitted=90.0,
        fitted_pick_on_true=96.0,
        wall_s=1.0,
    )
    assert not row.met
    assert msgspec.structs.replace(row, fitted_pick_on_true=97.5).met
    assert not msgspec.structs.replace(row, fitted_pick_on_true=None).met
