"""What a running twin reports, read as the gateway reads it: counters on the wall clock, and the
windowed acceptance through a drift, with and without /metrics (the parsers: tests/unit/test_loads.py)."""

from __future__ import annotations

import asyncio
import urllib.request

import aiohttp
import pytest

from backends.loads import parse_loads, parse_metrics
from tests.conftest import TEST_TIME_SCALE
from tests.support import gateway, get_json, wait_until
from twin import Engine, load_profile

MATH = [{"role": "user", "content": "A train travels 60 miles in 1.5 hours. What is its speed in miles per hour?"}]


def _twin_gauge(twin: str) -> float | None:
    with urllib.request.urlopen(f"{twin}/metrics", timeout=10) as r:
        report = parse_metrics(r.read().decode())
    return report.accept_length if report else None


def _twin_lifetime(twin: str) -> float | None:
    return parse_loads(get_json(f"{twin}/v1/loads")).lifetime_accept_length


async def _pump(url: str, until, concurrency: int = 4, model: str = "m") -> int:
    """Requests to `url` until `until()`: straight to a twin, as another gateway replica would
    send them, or to a gateway."""
    sent = 0
    async with aiohttp.ClientSession() as s:

        async def worker() -> None:
            nonlocal sent
            while not await asyncio.to_thread(until):
                body = {"model": model, "messages": MATH, "max_tokens": 200}
                async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()
                sent += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sent


def test_reported_acceptance_follows_the_metrics_gauge_through_a_drift(tmp_path, twin_factory):
    """The drafter degrades 10 s after start: the twin's lifetime average (what /v1/loads says)
    keeps most of its old value, the gateway reports the windowed gauge, as policies need."""
    twin = twin_factory(
        "k26-dflash", "--enable-metrics", "--fault-accept-drop-at", "10", "--fault-accept-drop-to", "0.3"
    )
    backends = [{"name": "d", "url": twin, "model": "kimi-k2.6", "strategy": "dflash"}]
    with gateway(tmp_path, backends, "[health]\ninterval_s = 0.1\n") as url:
        before: list[float] = []

        def dropped() -> bool:
            g = _twin_gauge(twin)
            if g and not before:
                before.append(g)
            return bool(before and g and g < 0.6 * before[0])

        asyncio.run(_pump(twin, dropped))
        assert before, "no window closed before the drop: the twin took over 10 s to start"
        after = _twin_gauge(twin)
        lifetime = _twin_lifetime(twin)

        def state():
            return {b["name"]: b for b in get_json(f"{url}/admin/backends")["backends"]}["d"]["reported_load"]

        assert wait_until(lambda: state()["accept_length"] == after)  # the twin is idle: its gauge stands
        reported = state()
    assert reported["accept_source"] == "metrics gauge"
    assert lifetime is not None and lifetime > 1.3 * after  # the lifetime average hides most of the drop
    assert reported["lifetime_accept_length"] == pytest.approx(lifetime)


def test_without_metrics_decode_moments_give_the_window_through_a_drift(tmp_path, twin_factory):
    """No --enable-metrics: the window comes from the difference of /v1/loads decode moments
    between polls, and follows the drop that the lifetime average hides."""
    twin = twin_factory("k26-dflash", "--fault-accept-drop-at", "10", "--fault-accept-drop-to", "0.3")
    backends = [{"name": "d", "url": twin, "model": "kimi-k2.6", "strategy": "dflash"}]

    def moments():
        return get_json(f"{twin}/v1/loads")["loads"][0]["decode_moments"]

    with gateway(tmp_path, backends, "[health]\ninterval_s = 0.1\n") as url:

        def state():
            return {b["name"]: b for b in get_json(f"{url}/admin/backends")["backends"]}["d"]["reported_load"]

        levels: list[float] = []  # the twin's own acceptance, window by window, from its moments
        last: list[list[float]] = []

        def dropped() -> bool:
            m = moments()
            if m is None:
                return False
            if not last:
                last.append(m)
            elif m[1] - last[0][1] >= 400:
                levels.append((m[5] - last[0][5]) / (m[1] - last[0][1]))
                last[0] = m
            return (
                len(levels) >= 2
                and levels[-1] < 0.6 * levels[0]
                and state() is not None
                and state()["accept_length"] is not None
                and state()["accept_length"] < 0.6 * levels[0]
            )

        asyncio.run(_pump(twin, dropped))
        # one more window of the twin's, wholly after the drop, to compare the gateway's with
        start = moments()
        asyncio.run(_pump(twin, lambda: moments()[1] - start[1] >= 400))
        end = moments()
        after = (end[5] - start[5]) / (end[1] - start[1])
        assert wait_until(lambda: state()["accept_length"] == pytest.approx(after, rel=0.25))
        reported = state()
        lifetime = _twin_lifetime(twin)
    assert reported["accept_source"] == "decode moments"
    assert lifetime is not None and lifetime > 1.3 * reported["accept_length"]  # what /v1/loads alone says


def test_a_time_scaled_twins_counters_are_read_on_the_wall_clock(tmp_path, twin_factory):
    """A twin at `--time-scale F` answers F times as fast as the hardware it simulates. The gateway
    times requests on the wall clock, so the twin reports its `/v1/loads` duration counters on the
    wall clock too (twin/info_api.py), as a real server does, and the gateway takes them as they
    come: the step time it learns from them is the one the twin's answers take. In simulated
    seconds (1/F = 50x too slow here), a backend known by its counters looked slower than one known
    by its answers, and the routing followed."""
    twin = twin_factory("k26-dflash")
    backends = [{"name": "d", "url": twin, "model": "kimi-k2.6", "strategy": "dflash"}]
    scale = float(TEST_TIME_SCALE)
    env = {"SPECROUTE_MEASURE_BACKENDS": "0"}  # the step time below is the counters' alone
    with gateway(tmp_path, backends, "[health]\ninterval_s = 0.1\n", env=env) as url:

        def estimate():
            return get_json(f"{url}/admin/backends")["policies"]["kimi-k2.6"]["backends"]["d"]

        start = get_json(f"{twin}/v1/loads")["loads"][0]["decode_moments"] or [0.0] * 6
        # through the gateway: a policy reads the polled counters when it routes
        asyncio.run(_pump(url, lambda: estimate()["step_server_windows"] >= 3, concurrency=1, model="kimi-k2.6"))
        end = get_json(f"{twin}/v1/loads")["loads"][0]["decode_moments"]
        learned_s = estimate()["step_ms"]["1"] / 1000
        reported = get_json(f"{url}/admin/backends")["backends"][0]["reported_load"]["decode_moments"]
    twin_step_s = (end[2] - start[2]) / (end[0] - start[0]) / 1e6  # the twin's counters: seconds per pass, batch 1
    hardware_s = Engine(load_profile("k26-dflash")).step_time(1)  # what the simulated hardware takes per pass
    assert twin_step_s == pytest.approx(hardware_s * scale, rel=0.5)  # on the wall clock: not hardware_s
    assert reported is not None
    assert reported[2] / reported[0] == pytest.approx(twin_step_s * 1e6, rel=0.5)
    assert learned_s == pytest.approx(hardware_s * scale, rel=0.5)  # not hardware_s: 50x apart
