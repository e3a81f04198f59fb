"""The evaluation's traffic: arrivals, sessions with prefix reuse, fleets, SLOs (no simulation)."""

import math
import random
import statistics

import pytest

from evaluate.arrivals import Arrivals, BurstShape
from evaluate.fleet import FleetError, fleet_label, parse_fleet, servers
from evaluate.slo import SLO, SloError, parse_slo
from evaluate.workload import Mix, draw_session, single_request


def _gaps(kind: str, rate: float, horizon: float, seed: int = 1, shape: BurstShape | None = None) -> list[float]:
    a = Arrivals(kind, rate, 0.0, random.Random(seed), shape)
    t, out = 0.0, []
    while True:
        t = a.next_after(t)
        if t > horizon:
            return out
        out.append(t)


def test_poisson_and_bursty_arrivals_keep_the_mean_rate_and_bursty_is_burstier():
    horizon = 20000.0
    poisson = _gaps("poisson", 2.0, horizon)
    bursty = _gaps("bursty", 2.0, horizon, shape=BurstShape(factor=3.0, duty=0.2, cycle_s=50.0))
    assert len(poisson) / horizon == pytest.approx(2.0, rel=0.03)
    assert len(bursty) / horizon == pytest.approx(2.0, rel=0.08)

    def window_counts(times: list[float]) -> list[int]:
        counts = [0] * int(horizon // 10)
        for t in times:
            counts[min(int(t // 10), len(counts) - 1)] += 1
        return counts

    # counts per 10 s window: Poisson's variance equals its mean, an MMPP's is far larger
    p, b = window_counts(poisson), window_counts(bursty)
    assert statistics.variance(p) / statistics.mean(p) == pytest.approx(1.0, abs=0.15)
    assert statistics.variance(b) / statistics.mean(b) > 3.0


def test_a_short_bursty_phase_carries_its_rate_on_average():
    """A phase samples a process that has been running: it starts in a burst with the burst's
    share of the time. Starting every phase quiet carried ~5% fewer requests in 90 s."""
    horizon, rate = 90.0, 4.0
    counts = [len(_gaps("bursty", rate, horizon, seed=s)) for s in range(3000)]
    assert statistics.mean(counts) / (rate * horizon) == pytest.approx(1.0, abs=0.03)


def test_arrivals_refuse_impossible_shapes():
    with pytest.raises(ValueError, match="positive"):
        Arrivals("poisson", 0.0, 0.0, random.Random(0))
    with pytest.raises(ValueError, match="factor x duty"):
        Arrivals("bursty", 1.0, 0.0, random.Random(0), BurstShape(factor=4.0, duty=0.3))
    with pytest.raises(ValueError, match="poisson or bursty"):
        Arrivals("closed", 1.0, 0.0, random.Random(0))


def test_a_chat_turn_extends_what_the_server_cached_for_the_previous_one():
    mix = Mix(chat=1.0, turns=(4, 4), think_s=5.0)
    s = draw_session("t:0", mix, ["code"], [1.0], (100, 200), None)
    assert s.kind == "chat" and len(s.turns) == 4
    for prev, turn in zip(s.turns, s.turns[1:], strict=False):
        n = len(prev.output_chain)
        assert turn.chain[:n] == prev.output_chain  # the whole earlier exchange is a cached prefix
        assert turn.prompt_tokens > prev.prompt_tokens + prev.answer_tokens
        assert turn.delay_s > 0
    assert s.turns[0].delay_s == 0.0
    # same tag, same session (common random numbers); another tag, another one
    assert draw_session("t:0", mix, ["code"], [1.0], (100, 200), None) == s
    assert draw_session("t:1", mix, ["code"], [1.0], (100, 200), None) != s


def test_thinking_chat_turns_lose_the_reasoning_from_the_prefix_but_agent_loops_keep_it():
    from twin.thinking import ReasoningModel

    reasoning = ReasoningModel(math=800, code=800, chat=800)
    chat = draw_session("k", Mix(chat=1.0, thinking=1.0, turns=(3, 3)), ["math"], [1.0], (100, 200), reasoning)
    a, b = chat.turns[0], chat.turns[1]
    assert a.reasoning_tokens == 800 and a.thinking
    shared = sum(1 for x, y in zip(a.output_chain, b.chain, strict=False) if x == y)
    assert len(a.chain) <= shared < len(a.output_chain)  # diverges after the prompt, inside the reasoning
    agent = draw_session("k", Mix(agent=1.0, thinking=1.0, tool_calls=(3, 3)), ["code"], [1.0], (100, 200), reasoning)
    assert [t.tool_call for t in agent.turns] == [True, True, False]
    assert all(t.tools for t in agent.turns)
    first, second = agent.turns[0], agent.turns[1]
    assert second.chain[: len(first.output_chain)] == first.output_chain


def test_shares_of_the_mix_hold_over_many_sessions():
    mix = Mix(chat=0.3, agent=0.2, thinking=0.5, long_context=0.1, temperatures=((0.0, 1.0), (1.0, 3.0)))
    sessions = [draw_session(f"s:{i}", mix, ["math", "chat"], [1.0, 3.0], (100, 200), None) for i in range(2000)]

    def share(pred) -> float:
        return sum(1 for s in sessions if pred(s)) / len(sessions)

    assert share(lambda s: s.kind == "chat") == pytest.approx(0.3, abs=0.04)
    assert share(lambda s: s.kind == "agent") == pytest.approx(0.2, abs=0.04)
    assert share(lambda s: s.turns[0].thinking) == pytest.approx(0.5, abs=0.04)
    assert share(lambda s: s.turns[0].temperature == 1.0) == pytest.approx(0.75, abs=0.04)
    assert share(lambda s: s.domain == "chat") == pytest.approx(0.75, abs=0.04)
    assert share(lambda s: s.turns[0].prompt_tokens > 16000) == pytest.approx(0.1, abs=0.03)
    assert mix.mean_turns == pytest.approx(0.5 + 0.3 * 4 + 0.2 * 4)


def test_mix_validation_names_the_field():
    with pytest.raises(ValueError, match=r"mix\.chat"):
        Mix(chat=1.5).validate()
    with pytest.raises(ValueError, match="at most 1"):
        Mix(chat=0.7, agent=0.5).validate()
    with pytest.raises(ValueError, match="temperatures"):
        Mix(temperatures=((3.0, 1.0),)).validate()


def test_single_requests_are_issue_5s():
    s = single_request("x", "math", 200, 300)
    (t,) = s.turns
    assert s.exact_length and t.max_tokens == 300 and t.temperature == 0.0 and not t.thinking
    assert len(t.chain) == 200 // 64


def test_fleet_strings_parse_with_counts_and_options():
    members = parse_fleet("2xk26-ddtree:b=16,k26-dflash:t=1.3:a=0.8")
    assert [(m.profile, m.count, m.budget, m.time_scale, m.accept_scale) for m in members] == [
        ("k26-ddtree", 2, 16, 1.0, 1.0),
        ("k26-dflash", 1, None, 1.3, 0.8),
    ]
    names = [s.name for s in servers(members)]
    assert names == ["k26-ddtree:b=16-1", "k26-ddtree:b=16-2", "k26-dflash:t=1.3:a=0.8"]
    assert fleet_label(parse_fleet("k26-dflash,k26-ar,k26-dflash")) == "k26-ar,2xk26-dflash"
    slow = members[1].build_profile()
    assert slow.step.t0_ms == pytest.approx(1.3 * parse_fleet("k26-dflash")[0].build_profile().step.t0_ms)
    assert members[0].build_profile().speculative.ddtree_budget == 16


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ("", "empty fleet"),
        ("0xk26-dflash", "at least one server"),
        ("k26-nope", "unknown profile 'k26-nope'"),
        ("k26-dflash:b=8", "not a DDTree profile"),
        ("k26-ddtree:b=x", "b= needs a number"),
        ("k26-ddtree:q=1", "unknown option 'q=1'"),
        ("k26-dflash:t=0", "t=0 must be within"),
        ("k26-dflash:t=nan", "t=nan must be within"),
        ("99xk26-dflash", "at most 64"),
    ],
)
def test_bad_fleets_name_the_culprit(text, culprit):
    with pytest.raises(FleetError, match=culprit):
        parse_fleet(text)


def test_a_profile_file_that_does_not_load_says_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-profile.toml").write_text('[build-system]\nrequires = ["x"]\n')
    with pytest.raises(FleetError) as err:
        parse_fleet("my-profile.toml")
    assert "build-system" in str(err.value) and "unknown profile" not in str(err.value)


def test_slo_parse_and_judge():
    slo = parse_slo("ttft=2,tpot=0.05s")
    assert slo == SLO(ttft_s=2.0, tpot_s=0.05)
    assert parse_slo("tpot=0.1").ttft_s == SLO().ttft_s
    assert slo.met(1.9, 0.05) and not slo.met(2.1, 0.01) and not slo.met(None, None)
    for bad, culprit in (
        ("ttft", "ttft"),
        ("ttft=-1", "positive"),
        ("speed=3", "speed=3"),
        ("ttft=1,ttft=2", "twice"),
        ("tpot=inf", "positive"),
        ("ttft=abc", "abc"),
    ):
        with pytest.raises(SloError, match=culprit):
            parse_slo(bad)
    assert not math.isnan(slo.ttft_s)
