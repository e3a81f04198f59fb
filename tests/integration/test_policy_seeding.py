"""No home advantage: the gateway measures each backend at startup and routes by what it measured,
on twins whose physics differ from the policy's priors (the studies' figures).

Twins: EAGLE-3 at the tests' time scale; DFlash 3x slower (time scale x3, a slower machine) with its
drafts accepted 0.6x as often (the twin's accept_scale knob from the first second). The priors say
DFlash decodes ~1.6x faster than EAGLE-3 at batch 1; here EAGLE-3 is ~2-3x faster. Cold-start regret
is the share of the first sequential requests sent to the slower backend.
"""

from __future__ import annotations

import openai

from backends import BackendSpec, Strategy
from backends.measure import Measurement
from policies import Domain, Goodput, RequestFeatures
from tests.conftest import TEST_TIME_SCALE
from tests.support import gateway, get_json, wait_until

MATH = [
    {
        "role": "user",
        "content": "Sam is 3 times as old as Ann; in 6 years he will be twice her age. How old is Ann now?",
    }
]
FIRST = 8


def _backends(twin_factory) -> list[dict]:
    slow = str(float(TEST_TIME_SCALE) * 3)
    return [
        {"name": "k26-eagle3", "url": twin_factory("k26-eagle3"), "model": "kimi-k2.6", "strategy": "eagle3"},
        {
            "name": "k26-dflash",
            "url": twin_factory(
                "k26-dflash", "--time-scale", slow, "--fault-accept-drop-at", "0", "--fault-accept-drop-to", "0.6"
            ),
            "model": "kimi-k2.6",
            "strategy": "dflash",
        },
    ]


def _first_choices(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    return [
        client.chat.completions.with_raw_response.create(
            model="kimi-k2.6", messages=MATH, max_tokens=48, temperature=0
        ).headers["x-specroute-backend"]
        for _ in range(FIRST)
    ]


def _measured(url: str) -> bool:
    backends = get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["backends"]
    return all(backends.get(n, {}).get("observed", 0) >= 1 for n in ("k26-eagle3", "k26-dflash"))


def test_startup_measurement_removes_the_priors_head_start(tmp_path, twin_factory):
    backends = _backends(twin_factory)
    with gateway(tmp_path, backends) as url:
        assert wait_until(lambda: _measured(url), timeout=30)
        seeded = _first_choices(url)
        state = get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["backends"]
    # the measured acceptance follows the twin's knob, not the prior (DFlash math prior: 4.9)
    assert state["k26-dflash"]["accept_length"]["math"] < 4.0
    regret_seeded = seeded.count("k26-dflash") / FIRST
    with gateway(tmp_path, backends, env={"SPECROUTE_MEASURE_BACKENDS": "0"}) as url:
        unseeded = _first_choices(url)
    regret_prior = unseeded.count("k26-dflash") / FIRST
    print(
        f"cold-start regret (first {FIRST} requests on the slower backend): "
        f"seeded {regret_seeded:.2f}, priors only {regret_prior:.2f}"
    )
    assert seeded[0] == "k26-eagle3" and regret_seeded <= 1 / FIRST, seeded
    assert unseeded[0] == "k26-dflash", unseeded  # the priors' head start: the test can fail


def test_a_measurement_replaces_the_prior_and_garbage_is_ignored():
    spec = BackendSpec(name="d", url="http://x", model="m", strategy=Strategy.DFLASH)
    policy = Goodput(seed=0)
    est = policy.estimates.register("d", Strategy.DFLASH)
    before = est.step_s(1)
    policy.seed(
        spec,
        Measurement(
            step_s=before * 2,
            accept_length={Domain.MATH: 3.0, Domain.CHAT: 2.0},
            prefill_base_s=0.1,
            prefill_per_token_s=0.5e-3,
        ),
    )
    assert est.step_s(1) == before * 2 and est.step_s(8) > est.curve.prior_s(8) * 1.9  # whole curve rescaled
    assert abs(est.accept_length(0) - 3.0) < 1e-9 and abs(est.accept_length(2) - 2.0) < 1e-9
    assert 1.0 < est.accept_length(1) < 4.2  # code follows the measured level, not the prior's 4.2
    # the prefill slope is the measured one; the fixed part is a forward pass at the measured step time
    assert est.prefill.per_token_s == 0.5e-3 and est.prefill_s(1000) == est.step_s(1) + 0.5
    policy.seed(
        spec,
        Measurement(
            step_s=-1.0, accept_length={Domain.MATH: 1e9}, prefill_base_s=float("nan"), prefill_per_token_s=1.0
        ),
    )
    assert est.step_s(1) == before * 2 and abs(est.accept_length(0) - 3.0) < 1e-9
    assert est.prefill.base_s == 0.1 and est.prefill.per_token_s == 0.5e-3
    decision = policy.choose(RequestFeatures(model="m", domain=Domain.MATH, temperature=0.0), [*_views(spec)])
    assert decision.backend.name == "d"


def _views(spec: BackendSpec):  # type: ignore[no-untyped-def]
    from policies import BackendView

    yield BackendView(spec=spec)
