"""Soak: many requests with random client disconnects; in-flight returns to 0 and memory stays flat.

The short variant runs in `make test`; the full size (20,000 requests) runs with
`pytest -m soak` (or `make soak`).
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest

from tests.integration.test_resilience import _gateway_pid, _rss_kb
from tests.support import gateway, get_json, wait_until

MSG = [{"role": "user", "content": "Write a haiku about the sea."}]


async def _drive(url: str, total: int, concurrency: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"ok": 0, "disconnected": 0, "other": 0}
    todo = iter(range(total))

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in todo:
            stream = rng.random() < 0.7
            disconnect = stream and rng.random() < 0.3
            body = {"model": "kimi-k2.6", "messages": MSG, "max_tokens": rng.randint(1, 40), "stream": stream}
            async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                if disconnect:
                    await r.content.readany()
                    r.close()  # drop the connection mid-stream
                    counts["disconnected"] += 1
                    continue
                await r.read()
                counts["ok" if r.status == 200 else "other"] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return counts


def _soak(tmp_path, twin_factory, total: int) -> None:
    backends = [
        {"name": f"z{i}", "url": twin_factory("zero"), "model": "kimi-k2.6", "strategy": "ar"} for i in range(2)
    ]
    with gateway(tmp_path, backends) as url:
        pid = _gateway_pid(int(url.rsplit(":", 1)[1]))
        asyncio.run(_drive(url, max(200, total // 10), 16, seed=1))  # warm-up: pools, caches, allocator
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0)
        rss_start = _rss_kb(pid)
        counts = asyncio.run(_drive(url, total, 32, seed=2))
        assert wait_until(lambda: get_json(f"{url}/admin/backends")["inflight"] == 0)
        state = get_json(f"{url}/admin/backends")
        rss_end = _rss_kb(pid)
    print(f"\nsoak {total}: {counts}, RSS {rss_start} -> {rss_end} kB ({(rss_end / rss_start - 1) * 100:+.1f}%)")
    assert counts["other"] == 0 and counts["disconnected"] > 0
    assert all(b["inflight"] == 0 for b in state["backends"]) and state["waiting"] == 0
    assert rss_end < rss_start * 1.10


def test_soak_short(tmp_path, twin_factory):
    _soak(tmp_path, twin_factory, 1500)


@pytest.mark.soak
def test_soak_full(tmp_path, twin_factory):
    _soak(tmp_path, twin_factory, 20_000)
