"""`loadgen study`: the comparison rules, the study data and time scaling (quick studies run end to
end as real processes: tests/integration/test_loadgen_study_run.py)."""

from __future__ import annotations

import tomllib

import pytest

from loadgen import checks, timescale
from loadgen.studies import REFERENCES, STUDIES, Leg
from loadgen.study import UsageError, apply_overrides, target_words
from loadgen.summary import Level, RequestRecord, Run, Summary, TurnLevel
from loadgen.twins import Profile, gateway_config


def _level(c: int, **kw) -> Level:
    base = dict(
        max_concurrency=c,
        completed=c,
        failed=0,
        duration=20.0,
        total_output_tokens=512 * c,
        output_throughput=25.6 * c,
        request_throughput=c / 20.0,
        mean_request_output_throughput=25.6,
        median_ttft_ms=100.0,
        p99_ttft_ms=120.0,
        mean_tpot_ms=38.0,
        median_itl_ms=38.0,
        mean_e2e_latency_ms=20000.0,
        accept_length=None,
        backends={},
    )
    return Level(**{**base, **kw})


# --- comparison rule ----------------------------------------------------------------------------


def test_value_reference_passes_within_tolerance_only() -> None:
    r1 = REFERENCES["R1"]  # 26.3 tok/s
    assert checks.compare(r1, 26.3) == (0.0, True)
    err, ok = checks.compare(r1, 27.6)
    assert err == pytest.approx(4.94, abs=0.01) and ok
    err, ok = checks.compare(r1, 27.7)
    assert err == pytest.approx(5.32, abs=0.01) and not ok
    err, ok = checks.compare(r1, 24.9)
    assert err < 0 and not ok  # signed: below the reference
    assert checks.compare(r1, 27.7, tolerance_pct=10.0)[1]
    assert checks.compare(r1, None) == (None, False)  # a figure not measured fails
    assert checks.compare(r1, float("nan")) == (None, False)


def test_range_reference_measures_from_the_nearest_bound() -> None:
    r8 = REFERENCES["R8"]  # 3.6-4.9
    assert checks.compare(r8, 4.2) == (0.0, True)
    err, ok = checks.compare(r8, 5.0)
    assert err == pytest.approx(100 * 0.1 / 4.9) and ok
    err, ok = checks.compare(r8, 3.4)
    assert err == pytest.approx(-100 * 0.2 / 3.6) and not ok


def test_reference_overrides_and_their_errors() -> None:
    refs = apply_overrides(REFERENCES, ["R2=900", "R8=3-5"])
    assert refs["R2"].value == 900 and refs["R8"].low == 3 and refs["R8"].high == 5
    assert REFERENCES["R2"].value == 807.5  # the shipped data is not modified
    for bad in (["R99=1"], ["R1"], ["R1=abc"], ["R8=5-3"], ["R8-order=1"], ["R1=0"]):
        with pytest.raises(UsageError):
            apply_overrides(REFERENCES, bad)


def test_target_words_named_positional_and_gateway_names() -> None:
    s = STUDIES["k26-strategies"]
    words = target_words(s, "gateway=http://gw:8000,http://a:1,k26-dflash,k26-eagle3=http://e:2")
    assert words == {
        "gateway": "http://gw:8000",
        "k26-eagle3": "http://e:2",
        "k26-dflash": "k26-dflash",
        "k26-ar": "http://a:1",
    }
    assert target_words(STUDIES["k26-ar-sweep"], "http://gpu:30000") == {"k26-ar": "http://gpu:30000"}
    with pytest.raises(UsageError):
        target_words(STUDIES["k26-ar-sweep"], "http://a:1,http://b:2")
    with pytest.raises(UsageError):
        target_words(STUDIES["k26-ar-sweep"], "nope=http://a:1")


# --- study data ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_check_points_at_a_reference_and_a_planned_level(name: str) -> None:
    study = STUDIES[name]
    legs = {leg.label: leg for leg in study.legs}
    assert len(legs) == len(study.legs)
    assert all(leg.target in study.targets for leg in study.legs)
    for chk in study.checks:
        ref = REFERENCES[chk.ref]
        assert ref.id in {f"R{i}" for i in range(1, 9)}
        for label in chk.legs or (chk.leg,):
            assert chk.concurrency in legs[label].levels(quick=False)
        assert chk.metric in checks.DERIVED or chk.metric in Level.__struct_fields__


def test_study_references_match_studies_md() -> None:
    assert {k: REFERENCES[k].value for k in ("R1", "R2", "R3", "R4", "R5", "R6", "R7")} == {
        "R1": 26.3,
        "R2": 807.5,
        "R3": 19.6,
        "R4": 26.0,
        "R5": 173.0,
        "R6": 64.0,
        "R7": 2577.0,
    }
    assert (REFERENCES["R8"].low, REFERENCES["R8"].high) == (3.6, 4.9)
    assert (REFERENCES["R5-step"].value, REFERENCES["R6-step"].value) == (87.0, 77.0)
    sweep = STUDIES["k26-ar-sweep"]
    assert sweep.legs[0].concurrency == (1, 2, 4, 8, 16, 32)
    assert sweep.legs[0].max_tokens == 512
    assert {c.ref for c in sweep.checks} == {"R1", "R2", "R3"}
    assert set(STUDIES["k26-strategies"].targets) == {"k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "gateway"}


def test_prompts_per_level_are_whole_batches() -> None:
    leg = Leg(
        label="x",
        target="x",
        dataset="mixed",
        concurrency=(1, 2, 4, 32),
        batches=2,
        min_prompts=6,
        quick_batches=1,
        quick_min_prompts=3,
    )
    assert [leg.num_prompts(c, quick=False) for c in (1, 2, 4, 32)] == [6, 6, 8, 64]
    assert [leg.num_prompts(c, quick=True) for c in (1, 2, 4, 32)] == [3, 4, 4, 32]


# --- derived figures and evaluation -------------------------------------------------------------


def test_wall_per_batch_and_step_time() -> None:
    lv = _level(4, completed=7, failed=1, duration=40.0, accept_length=5.0, mean_tpot_ms=15.0)
    assert checks.DERIVED["wall_per_batch_s"](lv) == 20.0  # 8 requests = 2 batches of 4
    assert checks.DERIVED["step_ms"](lv) == 75.0  # TPOT x tokens per verify step
    assert checks.DERIVED["step_ms"](_level(1)) == 38.0  # autoregressive: one token per step


def _dflash_summary(accepts: dict[str, float], tok_s: float = 2577.0) -> Summary:
    runs = [
        Run(target=f"k26-dflash/{d}", url="u", dataset=d, levels=[_level(32, accept_length=a, output_throughput=tok_s)])
        for d, a in accepts.items()
    ]
    return Summary(runs=runs)


def test_evaluate_value_range_and_order_rows() -> None:
    study = STUDIES["k26-dflash-c32"]
    good = checks.evaluate(study, _dflash_summary({"math": 4.9, "code": 4.2, "chat": 3.7}), REFERENCES)
    assert [r.key for r in good] == ["R7", "R8", "R8", "R8", "R8-order"]
    assert all(r.passed for r in good) and checks.failed(good) == []
    bad = checks.evaluate(study, _dflash_summary({"math": 4.0, "code": 4.2, "chat": 3.0}, tok_s=2000.0), REFERENCES)
    status = {(r.key, r.target): r.status for r in bad}
    assert status[("R7", "k26-dflash/math")] == "fail"
    assert status[("R8", "k26-dflash/chat")] == "fail"  # 3.0 < 3.6 by more than 5%
    assert status[("R8-order", "k26-dflash/math, k26-dflash/code, k26-dflash/chat")] == "fail"
    # a target that stopped early: its figures fail as "not measured"
    partial = checks.evaluate(study, _dflash_summary({"math": 4.9}), REFERENCES)
    assert {r.status for r in partial if "code" in r.target} == {"not measured"}
    assert all(r.passed is False for r in partial if r.status == "not measured")
    # a target left out of --target: skipped, neither pass nor fail
    skipped = checks.evaluate(study, Summary(), REFERENCES, skipped=[leg.label for leg in study.legs])
    assert {r.status for r in skipped} == {"skipped"} and checks.failed(skipped) == []


def test_quick_mode_drops_checks_of_levels_it_does_not_run() -> None:
    study = STUDIES["k26-strategies"]
    rows = checks.evaluate(study, Summary(), REFERENCES, quick=True)
    assert sorted({r.concurrency for r in rows}) == [1, 8, 32]


def test_gateway_against_the_best_backend() -> None:
    summary = Summary(
        runs=[
            Run(target="k26-ar", url="a", dataset="mixed", levels=[_level(8, output_throughput=200)]),
            Run(target="k26-dflash", url="d", dataset="mixed", levels=[_level(8, output_throughput=600)]),
            Run(
                target="gateway",
                url="g",
                dataset="mixed",
                levels=[_level(8, output_throughput=450, backends={"k26-dflash": 6, "k26-ar": 2})],
            ),
        ]
    )
    (row,) = checks.gateway_vs_best(summary)
    assert (row.best_backend, row.best_tok_s, row.ratio) == ("k26-dflash", 600, 0.75)


# --- time scale ---------------------------------------------------------------------------------


def test_every_result_field_has_a_time_scale_rule() -> None:
    assert timescale.unclassified(Level) == set()
    assert timescale.unclassified(RequestRecord) == set()
    assert timescale.unclassified(TurnLevel) == set()


def test_rescale_divides_durations_and_multiplies_rates() -> None:
    lv = _level(
        32,
        duration=1.0,
        output_throughput=16000.0,
        median_ttft_ms=5.0,
        accept_length=4.5,
        mean_request_output_throughput=500.0,
    )
    sim = timescale.rescale(lv, 0.05)
    assert sim.duration == pytest.approx(20.0) and sim.median_ttft_ms == pytest.approx(100.0)
    assert sim.output_throughput == pytest.approx(800.0)
    assert sim.mean_request_output_throughput == pytest.approx(25.0)
    assert sim.accept_length == 4.5 and sim.total_output_tokens == lv.total_output_tokens
    rec = RequestRecord(
        index=0,
        target="t",
        max_concurrency=1,
        request_rate=None,
        domain="math",
        start_s=0.5,
        ok=True,
        e2e_ms=1000.0,
        output_throughput=512.0,
        output_tokens=512,
        accept_length=4.0,
    )
    srec = timescale.rescale(rec, 0.05)
    assert (srec.start_s, srec.e2e_ms, srec.output_throughput) == pytest.approx((10, 20000, 25.6))
    assert srec.output_tokens == 512 and srec.accept_length == 4.0
    assert timescale.rescale(lv, 1.0) is lv


def test_gateway_config_is_valid_toml_listing_the_twins() -> None:
    text = gateway_config(
        "127.0.0.1:9000",
        [
            ("k26-ar", "http://127.0.0.1:1", Profile("k26-ar", "ar", "kimi-k2.6", "")),
            ("k26-dflash", "http://127.0.0.1:2", Profile("k26-dflash", "dflash", "kimi-k2.6", "")),
        ],
        policy="least_inflight",
    )
    cfg = tomllib.loads(text)
    assert cfg["gateway"] == {"listen": "127.0.0.1:9000", "policy": "least_inflight"}
    assert [(b["name"], b["strategy"], b["model"]) for b in cfg["backends"]] == [
        ("k26-ar", "ar", "kimi-k2.6"),
        ("k26-dflash", "dflash", "kimi-k2.6"),
    ]


# --- the command as a real process --------------------------------------------------------------
