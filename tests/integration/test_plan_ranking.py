"""`specroute plan`'s ranking on the virtual clock: past the speculative servers' caps, and its
repeatability (every fleet on the same arrivals, scores averaged over seeds)."""

import json

from evaluate.plan import SLO_PARITY, plan
from evaluate.traffic import load_traffic

# Short chat answers at 12 requests/s on two servers: more than two speculative servers carry
# under SGLang's cap of 48 running requests each, less than two AR servers do.
ABOVE_THE_CAPS = [
    {"settings": {"min_tokens": 256, "max_tokens": 512}},
    {"name": "peak", "hours": 1, "rate": 12.0, "domains": {"chat": 1}},
]
TWO_PHASES = [
    {"settings": {"min_tokens": 64, "max_tokens": 128}},
    {"name": "quiet", "hours": 6, "load": 0.25, "domains": {"math": 1}},
    {"name": "busy", "hours": 2, "rate": 6.0, "domains": {"chat": 1, "code": 1}},
]


def _traffic(tmp_path, rows):
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_traffic(str(path))


def test_above_the_speculative_caps_the_plan_prefers_the_fleet_that_keeps_the_slo(tmp_path):
    """Past the speculative servers' caps their queues grow without bound: the requests they
    serve are fast, the others wait. A fleet that misses the SLO much more often than the most
    reliable homogeneous one ranks after it, whatever its mean request tok/s."""
    traffic = _traffic(tmp_path, ABOVE_THE_CAPS)
    res = plan(2, traffic, types=("k26-ar", "k26-dflash"), sample_s=60.0, seeds=2, jobs=1)
    by = {f.fleet: f for f in res.ranked}
    assert res.ranked[0].fleet == "2xk26-ar" and res.best_homogeneous.fleet == "2xk26-ar"
    assert by["2xk26-dflash"].worst_slo < by["2xk26-ar"].worst_slo - SLO_PARITY
    assert not by["2xk26-dflash"].slo_parity and not by["k26-ar,k26-dflash"].slo_parity


def test_every_fleet_is_scored_on_the_same_arrivals_and_the_ranking_repeats(tmp_path):
    traffic = _traffic(tmp_path, TWO_PHASES)
    runs = [plan(2, traffic, types=("k26-ar", "k26-dflash"), sample_s=20.0, seeds=2, jobs=1) for _ in range(2)]
    first, again = ([(f.fleet, f.policy, f.seed_scores) for f in r.ranked] for r in runs)
    assert first == again and all(len(s) == 2 for _, _, s in first)
    for phase in ("quiet", "busy"):  # common random numbers: every fleet gets the same requests
        assert len({f.phases[phase].arrived for f in runs[0].ranked}) == 1
