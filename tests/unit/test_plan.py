"""`specroute plan`: fleet search on the virtual clock, its bad-input errors and traffic files."""

import io
import json

import msgspec
import pytest

from evaluate.cli_plan import main, print_plan
from evaluate.fleet import parse_member
from evaluate.fluid import PhaseGrid, type_curve
from evaluate.plan import (
    BURST_CYCLES,
    FleetFigures,
    FreshSeeds,
    PhaseFigures,
    compositions,
    plan,
    rank_fleets,
    sample_length,
    within_noise,
)
from evaluate.sim import simulate
from evaluate.traffic import TrafficError, load_traffic
from policies.simple import LeastInflight
from tests.support import REPO

TINY = [
    {"settings": {"min_tokens": 64, "max_tokens": 128}},
    {"name": "quiet", "hours": 6, "load": 0.25, "domains": {"math": 1}},
    {"name": "busy", "hours": 2, "rate": 6.0, "domains": {"chat": 1, "code": 1}},
]


def _traffic(tmp_path, rows, name="traffic.jsonl"):
    path = tmp_path / name
    path.write_text("# a comment line\n" + "".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_compositions_are_every_way_to_fill_n_servers():
    assert sorted(compositions(2, 3)) == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert len(compositions(6, 8)) == 1287  # C(13, 5)
    assert all(sum(c) == 4 for c in compositions(5, 4))


def test_a_tiny_plan_ranks_fleets_against_the_best_homogeneous_and_matches_exhaustive_search(tmp_path):
    traffic = load_traffic(str(_traffic(tmp_path, TINY)))
    assert traffic.rates == (None, 6.0)
    res = plan(2, traffic, types=("k26-ar", "k26-dflash"), sample_s=30.0, seeds=2, jobs=1, exhaustive=True)
    assert res.compositions == 3 and res.servers == 2
    labels = [f.fleet for f in res.ranked]
    assert set(labels) == {"2xk26-ar", "2xk26-dflash", "k26-ar,k26-dflash"}
    # those that meet the SLO about as often as the most reliable homogeneous fleet first, by score
    keys = [(not f.slo_parity, -f.score) for f in res.ranked]
    assert keys == sorted(keys)
    assert res.seeds == [0, 1] and all(len(f.seed_scores) == 2 for f in res.ranked)
    best_h = res.best_homogeneous
    assert best_h.homogeneous and best_h.margin == pytest.approx(0.0)
    for f in res.ranked:
        assert f.margin == pytest.approx(f.score / best_h.score - 1)
        assert set(f.phases) == {"quiet", "busy"}
    # AR decodes ~26 tok/s per request, DFlash several times that: an AR-only fleet is last
    assert res.ranked[-1].fleet == "2xk26-ar"
    assert res.rates_rps["busy"] == 6.0 and res.spans_s == {"quiet": 6 * 3600.0, "busy": 2 * 3600.0}
    assert res.exhaustive_best is not None and res.exhaustive is not None
    assert len(res.exhaustive.scores) == 3 and res.exhaustive.pick == res.ranked[0].fleet
    assert res.exhaustive.gap >= -0.03  # within 3% of the best on seeds neither was chosen on
    assert any("restart" in a for a in res.assumptions) and any("fractions" in a for a in res.assumptions)
    assert res.reshape is not None and set(res.reshape.schedule) == {"quiet", "busy"}
    # a mixed winner's margin is simulated again on two fresh seeds; a homogeneous winner has none
    assert (res.fresh is None) == res.ranked[0].homogeneous
    if res.fresh is not None:
        assert res.fresh.seeds == [2, 3] and len(res.fresh.margins) == 2  # after the plan's seeds


# Short chat answers at 12 requests/s on two servers: more than two speculative servers carry
# under SGLang's cap of 48 running requests each, less than two AR servers do.
ABOVE_THE_CAPS = [
    {"settings": {"min_tokens": 256, "max_tokens": 512}},
    {"name": "peak", "hours": 1, "rate": 12.0, "domains": {"chat": 1}},
]


def test_the_fluid_model_sees_speculative_caps_bind_where_ar_batches_grow(tmp_path):
    traffic = load_traffic(str(_traffic(tmp_path, ABOVE_THE_CAPS)))
    scenario, phase = traffic.scenario, traffic.scenario.phases[0]
    ar, dflash = (type_curve(parse_member(t), scenario, phase) for t in ("k26-ar", "k26-dflash"))
    assert ar.saturation_rps > dflash.saturation_rps  # per request DFlash is faster; its cap binds
    grid = PhaseGrid([ar, dflash], 12.0)
    assert grid.headroom((0, 2)) < 1.0 < grid.headroom((2, 0))


def test_fleets_within_the_seeds_noise_of_the_winner_are_ties():
    def fleet(scores):
        return FleetFigures(
            fleet="f", policy="p", score=sum(scores) / len(scores), fluid=0.0, homogeneous=True, seed_scores=scores
        )

    leader = fleet([100.0, 90.0, 110.0])
    assert within_noise(leader, fleet([101.0, 88.0, 108.0]))  # behind on two seeds, ahead on one
    assert not within_noise(leader, fleet([95.0, 85.0, 105.0]))  # 5 behind on every seed: no noise
    assert within_noise(leader, fleet([99.8, 89.8, 109.8]))  # 0.2%: below any gap worth a pick
    assert within_noise(leader, fleet([100.0, 90.0, 110.0]))


def test_the_best_homogeneous_fleet_leads_the_mixes_it_ties_with():
    """A mix ahead by less than the seeds' noise is not worth two kinds of server: the best
    homogeneous fleet ranks first. Ahead by more on every seed, the mix leads."""

    def fleet(name, scores, homogeneous):
        return FleetFigures(
            fleet=name,
            policy="p",
            score=sum(scores) / len(scores),
            fluid=0.0,
            homogeneous=homogeneous,
            seed_scores=scores,
            phases={"x": PhaseFigures(**_PHASE)},
        )

    homog = fleet("4xa", [100.0, 90.0, 110.0], True)
    other = fleet("4xb", [80.0, 70.0, 90.0], True)
    close = fleet("a,3xb", [101.0, 91.5, 110.0], False)  # 0.8% ahead, behind on no seed but noisy
    ranked, best = rank_fleets([close, other, homog])
    assert best is homog and [f.fleet for f in ranked] == ["4xa", "a,3xb", "4xb"] and close.tie
    clear = fleet("a,3xb", [106.0, 96.0, 116.0], False)  # 6 ahead on every seed
    ranked, best = rank_fleets([clear, other, fleet("4xa", [100.0, 90.0, 110.0], True)])
    assert [f.fleet for f in ranked][:2] == ["a,3xb", "4xa"] and not ranked[1].tie


_PHASE = {
    "score": 1.0,
    "request_tok_s": 1.0,
    "slo_attainment": 0.95,
    "goodput_rps": 1.0,
    "ttft_p99_ms": 1.0,
    "e2e_p99_s": 1.0,
    "shed": 0,
    "arrived": 1,
}


def test_a_margin_that_changes_sign_on_fresh_seeds_is_printed_as_a_tie(tmp_path):
    traffic = load_traffic(str(_traffic(tmp_path, TINY)))
    res = plan(2, traffic, types=("k26-ar", "k26-dflash"), sample_s=20.0, seeds=1, jobs=1)
    for margins, verdict in (([0.04, -0.01], "a tie"), ([0.04, 0.02], "ahead on every seed")):
        out = io.StringIO()
        print_plan(msgspec.structs.replace(res, fresh=FreshSeeds(seeds=[1, 2], margins=margins)), out)
        line = next(x for x in out.getvalue().splitlines() if x.startswith("on fresh seeds [1, 2]:"))
        assert f"{100 * margins[0]:+.1f}%, {100 * margins[1]:+.1f}%" in line and verdict in line


def test_phases_are_sampled_for_sample_s_and_a_bursty_one_for_several_burst_cycles(tmp_path):
    rows = [*TINY, {"name": "bursts", "hours": 1, "rate": 3.0, "arrival": "bursty"}]
    phases = load_traffic(str(_traffic(tmp_path, rows))).scenario.phases
    assert [sample_length(p, 600.0) for p in phases] == [600.0, 600.0, 600.0]  # longer than a phase's default
    assert sample_length(phases[0], 30.0) == 30.0
    assert sample_length(phases[2], 30.0) == BURST_CYCLES * 60.0  # the default shape's 60 s cycles


def test_a_phase_simulated_alone_gets_the_requests_it_got_in_the_whole_run(tmp_path):
    """plan's reshape compares fleets on one phase alone and scales the whole run's figure by
    their ratio: a different draw of a bursty phase's arrivals (a burst or none in 90 s) would
    make that ratio, and the advice, a coin toss."""
    rows = [*TINY[:2], {"name": "busy", "hours": 2, "rate": 6.0, "arrival": "bursty"}]
    traffic = load_traffic(str(_traffic(tmp_path, rows)))
    # a named traffic's streams are keyed by the phase's index, as here
    scenario = msgspec.structs.replace(traffic.scenario, pool=("k26-dflash",), streams_by_phase_name=False)
    rates = [traffic.rate_of(i, 1) for i in range(2)]
    whole = simulate(scenario, _least_inflight, phase_rates=rates)
    busy = msgspec.structs.replace(scenario, phases=scenario.phases[1:])
    alone = simulate(busy, _least_inflight, phase_rates=rates[1:], first_phase=1)
    expected = _requests(whole, 1)
    assert len(expected) > 50
    assert _requests(alone, 0) == expected
    other = simulate(busy, _least_inflight, phase_rates=rates[1:])  # as the first phase of a run: other draws
    assert _requests(other, 0) != expected


def test_a_traffic_file_draws_its_phases_requests_by_phase_name(tmp_path):
    """The same phase in a file of another name, or after a phase inserted before it, gets the
    same requests: a user comparing edits of a traffic file compares fleets, not draws."""
    busy = {"name": "busy", "hours": 2, "rate": 6.0, "domains": {"chat": 1}}

    def busy_requests(rows, name):
        traffic = load_traffic(str(_traffic(tmp_path, rows, name)))
        scenario = msgspec.structs.replace(traffic.scenario, pool=("k26-dflash",))
        rates = [traffic.rate_of(i, 1) for i in range(len(rows) - 1)]
        run = simulate(scenario, _least_inflight, phase_rates=rates)
        return _requests(run, len(rows) - 2)

    expected = busy_requests([TINY[0], busy], "a.jsonl")
    assert len(expected) > 50
    assert busy_requests([TINY[0], busy], "b.jsonl") == expected
    assert busy_requests([*TINY[:2], busy], "a.jsonl") == expected  # "quiet" inserted before it
    renamed = {**busy, "name": "peak"}  # another phase name: other draws
    assert busy_requests([TINY[0], renamed], "a.jsonl") != expected


def _least_inflight(engines, specs):
    return LeastInflight()


def _requests(run, phase):
    """(send time from the phase's start, prompt tokens) of each request of phase `phase`."""
    start = run.phase_starts[phase]
    return sorted((round(r.t_send - start, 6), r.prompt_tokens) for r in run.records + run.failed if r.phase == phase)


def test_plan_cli_prints_the_ranking_and_what_it_assumed(tmp_path, capsys):
    path = _traffic(tmp_path, TINY)
    out_dir = tmp_path / "out"
    assert (
        main(
            [
                "--servers",
                "2",
                "--traffic",
                str(path),
                "--types",
                "k26-ar,k26-dflash",
                "--sample-s",
                "30",
                "--seeds",
                "1",
                "--jobs",
                "1",
                "--output",
                str(out_dir),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "winner:" in out and "vs best homog." in out and "assumed:" in out and "over the day:" in out
    doc = json.loads((out_dir / "plan.json").read_text())
    assert doc["servers"] == 2 and doc["ranked"][0]["fleet"] in out


def test_the_documented_example_traffic_file_loads():
    path = REPO / "docs" / "examples" / "two-phase.jsonl"
    traffic = load_traffic(str(path))
    assert [p.name for p in traffic.scenario.phases] == ["night", "peak"]
    assert [p.arrival for p in traffic.scenario.phases] == ["poisson", "bursty"]
    assert traffic.rates == (2.5, None) and traffic.scenario.phases[0].mix is not None
    assert path.read_text() in (REPO / "docs" / "evaluation.md").read_text()


def test_plan_help_says_what_is_assumed(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Assumes" in out and "restart" in out and "--slo" in out


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["--servers", "0", "--traffic", "day"], "--servers 0"),
        (["--servers", "99", "--traffic", "day"], "--servers 99"),
        (["--servers", "2", "--traffic", "day", "--types", "k26-dflash,k26-nope"], "unknown profile 'k26-nope'"),
        (["--servers", "2", "--traffic", "day", "--types", "2xk26-dflash"], "take no count"),
        (["--servers", "2", "--traffic", "day", "--slo", "ttft=fast"], "ttft='fast'"),
        (["--servers", "2", "--traffic", "day", "--slo", "latency=3"], "latency=3"),
        (["--servers", "2", "--traffic", "no-such-traffic"], "unknown traffic 'no-such-traffic'"),
        (["--servers", "2", "--traffic", "day", "--jobs", "0"], "--jobs: expected an integer >= 1, got '0'"),
        (["--servers", "2", "--traffic", "missing/file.jsonl"], "no such traffic file"),
    ],
)
def test_bad_input_is_refused_naming_the_culprit(args, culprit, capsys):
    assert main(args) == 2
    assert culprit in capsys.readouterr().err


def test_an_output_that_cannot_be_a_directory_is_refused_before_the_run(tmp_path, capsys):
    from evaluate.cli import main as eval_main
    from loadgen.cli import main as loadgen_main

    taken = tmp_path / "a-file"
    taken.write_text("")
    for run, args in (
        (main, ["--servers", "2", "--traffic", "day"]),
        (eval_main, ["--scenario", "steady-1"]),
        (loadgen_main, ["--target", "gateway"]),
    ):
        assert _exit_code(run, [*args, "--output", str(taken)]) == 2
        assert "cannot be the output directory" in capsys.readouterr().err
    made = tmp_path / "new" / "dir"  # refused for its --servers, after --output was read
    assert _exit_code(main, ["--traffic", "day", "--output", str(made), "--servers", "x"]) == 2
    assert made.is_dir()


def _exit_code(main_function, argv):
    try:
        return main_function(argv)
    except SystemExit as ex:
        return ex.code


@pytest.mark.parametrize(
    ("lines", "line", "culprit"),
    [
        (['{"name": "a", "load": 0.5}', '{"name": "b", "load": 0.5'], 3, "not JSON"),
        (['{"name": "a", "load": 0.5, "speed": 3}'], 2, "unknown key 'speed'"),
        (['{"name": "a"}'], 2, "exactly one of rate"),
        (['{"name": "a", "rate": -1}'], 2, "rate must be a positive number"),
        (['{"name": "a", "load": 0.5}', '{"name": "a", "load": 0.4}'], 3, "used twice"),
        (['{"name": "a", "load": 0.5, "domains": {"poetry": 1}}'], 2, "unknown domain 'poetry'"),
        (['{"name": "a", "load": 0.5, "mix": {"chat": 2}}'], 2, "mix.chat"),
        (['{"name": "a", "load": 0.5, "mix": {"vibes": 1}}'], 2, "vibes"),
        (['{"name": "a", "load": 0.5, "arrival": "closed"}'], 2, "open loop"),
        (['{"name": "a", "load": 0.5}', '{"settings": {"min_tokens": 8}}'], 3, "comes first"),
        (['{"settings": {"color": 1}}'], 2, "unknown setting 'color'"),
        (['{"name": "a", "load": 0.5, "domains": "math"}'], 2, "domains: Expected `object`"),
        (['{"name": "a", "load": 0.5, "domains": {"math": "x"}}'], 2, "domains: Expected `float`"),
        (['{"name": "a", "load": 0.5, "arrival": 5}'], 2, "arrival: Expected `str`"),
        (['{"name": "a", "load": 0.5, "mix": "agent"}'], 2, "mix: Expected `object"),
        (['{"settings": {"max_queued": "x"}}', '{"name": "a", "load": 0.5}'], 2, "at `$.max_queued`"),
        (['{"settings": {"min_tokens": "abc"}}', '{"name": "a", "load": 0.5}'], 2, "at `$.min_tokens`"),
        (['{"settings": {"max_queued": 1.5}}', '{"name": "a", "load": 0.5}'], 2, "at `$.max_queued`"),
        (['{"settings": {"min_tokens": 900}}', '{"name": "a", "load": 0.5}'], 2, "min_tokens <= max_tokens"),
        (["[1, 2]"], 2, "JSON object"),
    ],
)
def test_traffic_file_errors_give_the_file_and_line(tmp_path, lines, line, culprit):
    path = tmp_path / "bad.jsonl"
    path.write_text("# header\n" + "\n".join(lines) + "\n")
    with pytest.raises(TrafficError) as err:
        load_traffic(str(path))
    assert f"{path}:{line}:" in str(err.value) and culprit in str(err.value)


def test_an_empty_traffic_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("# nothing\n\n")
    with pytest.raises(TrafficError, match="no phases"):
        load_traffic(str(path))


def test_named_traffic_is_an_open_loop_scenario():
    t = load_traffic("day")
    assert len(t.scenario.phases) == 8 and all(r is None for r in t.rates)
    assert sum(p.span_s for p in t.scenario.phases) == 24 * 3600
