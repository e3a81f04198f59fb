"""What the goodput policy learns from, and what it predicts from state instead of learning it.

- step time and prefill speed from the server's own counters (`/v1/loads` decode_moments and
  prefill totals), so that other requests' prefills riding in a request's passes do not make one of
  two identical servers look slower;
- TTFT from the prompts queued before a request (`BackendView.pending_prefill`), not from a
  per-backend constant learned on busy servers;
- acceptance with a shape shared by the backends of one strategy and a slow per-backend level;
- end to end: the gateway counts a request's prompt as pending until its first token and passes
  the twin's counters to the policy.
"""

from __future__ import annotations

import random
import threading

import openai
import pytest

from backends import BackendSpec, Strategy
from backends.loads import parse_loads
from policies import BackendView, Domain, Goodput, Outcome, RequestFeatures
from policies.acceptance import Acceptance, ShapeGroup
from policies.prefill import causal_pairs
from policies.priors import cell_of
from policies.server_counters import MAX_PREFILL_TOKENS, MIN_PREFILL_TOKENS, MIN_STEPS, CounterWindows
from tests.support import gateway, get_json, wait_until

CHAT = RequestFeatures(model="m", domain=Domain.CHAT, temperature=0.0, prompt_tokens=200)


def _view(name: str, **kw) -> BackendView:  # type: ignore[no-untyped-def]
    spec = BackendSpec(name=name, url=f"http://{name}", model="m", strategy=Strategy.DDTREE)
    return BackendView(spec=spec, max_running=48, **kw)


def _moments(steps: float, batch: float, step_s: float) -> tuple[float, ...]:
    """Cumulative decode moments after `steps` steps at `batch` sequences and `step_s` per step."""
    us = step_s * 1e6
    return (steps, steps * batch, steps * us, steps * batch * batch, steps * batch * us, steps * batch * 6)


# ------------------------------------------------------------------ counter windows


def test_a_window_closes_after_enough_steps_and_restarts_when_the_counters_go_back():
    w = CounterWindows()
    assert w.decode(_moments(100, 4, 0.05)) is None  # the first report opens a window
    assert w.decode(_moments(100 + MIN_STEPS - 1, 4, 0.05)) is None  # not enough steps yet
    batch, step = w.decode(_moments(100 + MIN_STEPS, 4, 0.05)) or (0.0, 0.0)
    assert batch == pytest.approx(4) and step == pytest.approx(0.05)
    assert w.decode(_moments(10, 2, 0.04)) is None  # the server restarted: a new window
    assert w.decode(_moments(10 + MIN_STEPS, 2, 0.04)) == pytest.approx((2, 0.04))
    assert w.decode((float("nan"), 1.0, 2.0)) is None
    assert w.prefill(1e6, 1000) is None
    rate, pairs, prompts = w.prefill(1e6 + 0.12e-3 * 1e6 * MIN_PREFILL_TOKENS, 1000 + MIN_PREFILL_TOKENS) or (0, 0, 0)
    assert rate == pytest.approx(0.12e-3) and pairs is None and prompts is None  # the gateway counted nothing


def test_a_prefill_window_carries_the_length_of_the_prompts_the_gateway_prefilled_in_it():
    w = CounterWindows()
    assert w.prefill(0.0, 0.0, (0.0, 0.0, 0.0)) is None
    # two prompts of 3000 tokens, cache empty: 3000 x 1500 pairs each
    got = w.prefill(0.8e6, 6000.0, (6000.0, 2 * causal_pairs(3000, 3000), 2.0))
    assert got == pytest.approx((0.8 / 6000, 1500.0, 2 / 6000))


def test_a_prefill_window_waits_for_a_report_between_the_gateways_prompts():
    # The server counts a long prompt's chunks as it computes them; the gateway counts the prompt
    # at its first token. A report taken while one of ours is part-way (own None) does not close
    # an aligned window: the next report between prompts closes it over the whole prompt.
    w = CounterWindows()
    w.prefill(0.0, 0.0, (0.0, 0.0, 0.0))
    assert w.prefill(2e6, 16_384.0, None) is None  # the first chunk of a 40k-token prompt
    got = w.prefill(6e6, 40_000.0, (40_000.0, causal_pairs(40_000, 40_000), 1.0))
    assert got == pytest.approx((6.0 / 40_000, 20_000.0, 1 / 40_000))
    # it closes anyway once it holds MAX_PREFILL_TOKENS, its length unknown
    assert w.prefill(6e6 + 1, 40_000.0 + MAX_PREFILL_TOKENS - 1, None) is None
    rate, pairs, prompts = w.prefill(7e6, 40_000.0 + MAX_PREFILL_TOKENS, None) or (0, 0, 0)
    assert rate == pytest.approx(1.0 / MAX_PREFILL_TOKENS) and pairs is None and prompts is None


def test_the_load_report_carries_the_prefill_counters_summed_over_ranks():
    rank = {
        "num_running_reqs": 1,
        "num_waiting_reqs": 0,
        "total_prefill_busy_us": 500,
        "total_prefill_uncached_tokens": 40,
    }
    report = parse_loads({"loads": [rank, dict(rank)]})
    assert report is not None and report.prefill_counters == (1000.0, 80.0)
    partial = parse_loads({"loads": [rank, {"num_running_reqs": 0, "num_waiting_reqs": 0}]})
    assert partial is not None and partial.prefill_counters is None  # one rank without them: unknown


# ------------------------------------------------------------------ step time


def _stalled_outcome(backend: str, *, stall_s: float) -> Outcome:
    """A 600-token request at 6 tokens a pass and 45 ms a pass, plus `stall_s` of others' prefill."""
    return Outcome(
        backend=backend,
        domain=Domain.CHAT,
        inflight_at_dispatch=4,
        completion_tokens=600,
        verify_ct=100,
        decode_s=100 * 0.045 + stall_s,
        ttft_s=0.2,
        features=CHAT,
    )


def test_identical_servers_stay_identical_when_one_gets_the_long_prompts():
    """Server a's requests sit beside others' long prefills (seconds of stall each), b's do not. With
    the servers' own counters (which leave prefill steps out) both step curves stay at the truth."""
    policy = Goodput(seed=0, epsilon=0.0)
    a, b = _view("a", inflight=4), _view("b", inflight=4)
    policy.choose(CHAT, [a, b])
    for i in range(1, 30):
        for v in (a, b):
            v.decode_moments = _moments(50 * i, 4, 0.045)
        policy.choose(CHAT, [a, b])  # the policy reads the views at decision time
        policy.observe(_stalled_outcome("a", stall_s=4.0))
        policy.observe(_stalled_outcome("b", stall_s=0.0))
    ea, eb = policy.estimates.backends["a"], policy.estimates.backends["b"]
    assert ea.server_steps > 20 and eb.server_steps > 20
    assert ea.step_s(4) == pytest.approx(0.045, rel=0.02) and eb.step_s(4) == pytest.approx(0.045, rel=0.02)


def test_without_counters_a_short_stalled_request_barely_moves_the_step_curve():
    policy = Goodput(seed=0, epsilon=0.0)
    policy.choose(CHAT, [_view("a")])
    est = policy.estimates.backends["a"]
    before = est.step_s(4)
    # a 24-token tool call over 4 passes, one of which carried a 2 s prefill chunk
    policy.observe(
        Outcome(
            backend="a",
            domain=Domain.CHAT,
            inflight_at_dispatch=4,
            completion_tokens=24,
            verify_ct=4,
            decode_s=4 * 0.045 + 2.0,
            ttft_s=0.2,
            features=CHAT,
        )
    )
    # it measured 0.55 s a pass (11x); weighed by its 4 passes it moves the curve a 16th of the way
    assert est.step_s(4) < 2 * before


# ------------------------------------------------------------------ TTFT from state


def test_a_short_request_does_not_queue_behind_a_long_prompt():
    policy = Goodput(seed=0, epsilon=0.0, bonus=0.0)
    busy, free = _view("busy", inflight=2), _view("free", inflight=3)
    for _ in range(3):
        assert policy.choose(CHAT, [busy, free]).backend.name == "busy"  # fewer requests: cheaper
    busy.pending_prefill = 60_000  # a long document waits to be prefilled there (~7 s)
    decision = policy.choose(CHAT, [busy, free])
    assert decision.backend.name == "free"
    assert decision.prefill_tokens == CHAT.prompt_tokens  # what the caller counts as pending


def test_prefill_speed_is_not_learned_from_a_busy_servers_ttft():
    policy = Goodput(seed=0, epsilon=0.0)
    policy.choose(CHAT, [_view("a")])
    est = policy.estimates.backends["a"]
    slope = est.prefill.per_token_s
    for _ in range(20):  # TTFTs of 10 s: waiting behind someone else's 80k-token prompt
        policy.observe(
            Outcome(
                backend="a",
                domain=Domain.CHAT,
                inflight_at_dispatch=5,
                completion_tokens=100,
                verify_ct=20,
                decode_s=1.0,
                ttft_s=10.0,
                prompt_tokens=200,
                cached_tokens=0,
                features=CHAT,
            )
        )
    assert est.prefill.per_token_s == slope and est.prefill.samples == 0
    policy.observe(
        Outcome(
            backend="a",
            domain=Domain.CHAT,
            inflight_at_dispatch=1,
            completion_tokens=100,
            verify_ct=20,
            decode_s=1.0,
            ttft_s=0.08,
            prompt_tokens=200,
            cached_tokens=0,
            features=CHAT,
        )
    )
    assert est.prefill.samples == 1  # an idle dispatch teaches it


# ------------------------------------------------------------------ acceptance


def test_backends_of_one_strategy_share_the_cell_shape_and_keep_their_own_level():
    """Two identical drafters: a serves mostly chat at temperature 1, b mostly greedy math. b
    predicts the chat cell it rarely served from a's requests, and their levels agree."""
    group = ShapeGroup((5.0, 4.5, 4.0))
    a, b = Acceptance((5.0, 4.5, 4.0), group), Acceptance((5.0, 4.5, 4.0), group)
    warm, math_c = cell_of(2, 1.0, 100), cell_of(0, 0.0, 100)
    truth = {warm: 3.0, math_c: 5.0}
    rng = random.Random(0)

    def noisy(c: int) -> float:
        return truth[c] * rng.lognormvariate(-0.01125, 0.15)  # mean 1: one prompt's spread

    for i in range(400):
        a.observe(math_c if i % 5 == 0 else warm, noisy(math_c if i % 5 == 0 else warm), passes=64)
        c = warm if i % 20 == 0 else math_c
        b.observe(c, noisy(c), passes=64)
    assert b.cells[warm] == pytest.approx(3.0, rel=0.08) and a.cells[warm] == pytest.approx(3.0, rel=0.08)
    assert a.level == pytest.approx(b.level, rel=0.08)


def test_the_level_ignores_unlucky_prompts_and_follows_a_real_drop():
    acc = Acceptance((5.0, 5.0, 5.0))
    c = cell_of(0, 0.0, 100)
    rng = random.Random(1)
    levels = []
    for _ in range(400):
        acc.observe(c, 5.0 * rng.lognormvariate(0, 0.15), passes=64)
        levels.append(acc.level)
    spread = max(levels[100:]) / min(levels[100:])
    assert spread < 1.15  # per-request noise of 15% moves the level by a few percent only
    for _ in range(8):
        acc.observe(c, 2.5, passes=64)  # the drafter degrades
    assert acc.cells[c] < 3.2


# ------------------------------------------------------------------ through the gateway


LONG = [{"role": "user", "content": "Summarise this report. " + "The quarterly figures rose again. " * 5000}]


def test_the_gateway_counts_a_prompt_pending_until_its_first_token_and_passes_the_counters(tmp_path, twin_factory):
    # real time (scale 1) for the twin, so that a ~40k-token prefill lasts long enough to be seen
    url = twin_factory("k26-ddtree", "--time-scale", "1.0")
    backends = [{"name": "d", "url": url, "model": "kimi-k2.6", "strategy": "ddtree"}]
    with gateway(tmp_path, backends, env={"SPECROUTE_MEASURE_BACKENDS": "0"}) as gw:
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        done = threading.Event()

        def send() -> None:
            stream = client.chat.completions.create(model="kimi-k2.6", messages=LONG, max_tokens=300, stream=True)
            for _ in stream:
                pass
            done.set()

        t = threading.Thread(target=send)
        t.start()
        try:

            def entry() -> dict:
                return get_json(f"{gw}/admin/backends")["policies"]["kimi-k2.6"]["backends"]["d"]

            def pending() -> int:
                return int(entry().get("pending_prefill", 0))

            assert wait_until(lambda: pending() > 30_000, timeout=10)  # queued/prefilling: ~40k tokens
            # its attention's causal pairs: about 40k x 40k / 2
            assert entry()["pending_pairs"] == pytest.approx(causal_pairs(pending(), pending()))
            assert wait_until(lambda: pending() == 0, timeout=30)  # its first token came
            after = entry()
            assert after["pending_pairs"] == 0 and after["prefilled_prompts"] == 1
            assert after["prefilled_tokens"] > 30_000  # counted as prefilled, for the server's windows
            assert done.wait(60)
        finally:
            t.join(60)

        def windows() -> bool:
            # the policy reads the polled counters when it decides: a request now and then, each
            # decoding ~50 steps, so that a window of 40 steps closes between two decisions
            client.chat.completions.create(
                model="kimi-k2.6", messages=[{"role": "user", "content": "hi"}], max_tokens=300
            )
            d = get_json(f"{gw}/admin/backends")["policies"]["kimi-k2.6"]["backends"]["d"]
            return d["step_server_windows"] >= 1 and d["prefill_server_windows"] >= 1

        assert wait_until(windows, timeout=30, interval=1.0)
        assert "prefill_ms_per_mpair" in entry()  # /admin/backends shows the learned pair cost


def test_a_streaming_request_is_a_resident_of_its_backend_until_it_ends(tmp_path, twin_factory):
    """The gateway keeps each running request among its backend's residents, with the chunks its
    stream has carried (`BackendView.residents`): the goodput policy holds another request's prefill
    against their TPOT. A stream is one from dispatch to its end; a non-streamed request is one too,
    with no chunks to read a pace from."""
    url = twin_factory("k26-ar", "--time-scale", "1.0")  # ~40 ms a token: a 200-token answer lasts seconds
    backends = [{"name": "a", "url": url, "model": "kimi-k2.6", "strategy": "ar"}]
    with gateway(tmp_path, backends, env={"SPECROUTE_MEASURE_BACKENDS": "0"}) as gw:
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        done = threading.Event()
        ask = [{"role": "user", "content": "Tell me about the sea."}]

        def send(stream: bool) -> None:
            # all 200 tokens, whatever answer length the twin's profile gives this prompt
            extra = {"ignore_eos": True}
            if stream:
                for _ in client.chat.completions.create(
                    model="kimi-k2.6", messages=ask, max_tokens=200, stream=True, extra_body=extra
                ):
                    pass
            else:
                client.chat.completions.create(model="kimi-k2.6", messages=ask, max_tokens=200, extra_body=extra)
            done.set()

        def entry() -> dict:
            return get_json(f"{gw}/admin/backends")["policies"]["kimi-k2.6"]["backends"]["a"]

        for stream in (True, False):
            done.clear()
            t = threading.Thread(target=send, args=(stream,))
            t.start()
            try:
                assert wait_until(lambda: entry().get("residents") == 1, timeout=30)
                if stream:
                    assert wait_until(lambda: entry()["residents_decoding"] == 1, timeout=30)
                else:
                    assert entry()["residents_decoding"] == 0  # no chunks: no pace
                assert done.wait(60)
                assert wait_until(lambda: entry()["residents"] == 0, timeout=10)
            finally:
                t.join(60)
