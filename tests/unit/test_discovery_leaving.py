"""gateway/discovery.py: the order of a name's change. A request that finds the model's pool empty
while the last member is still being retired must find the reason with it (a 503 that says the
name resolves to no address), so the reason is set before any member leaves. The DNS answers come
from a resolver written here, since the order is what is tested; the resolver itself is tested
against a real DNS server (tests/integration/test_discovery*.py)."""

from __future__ import annotations

import asyncio

from gateway.config import BackendEntry, DiscoverySection
from gateway.discovery import Discovery
from gateway.pool import Pools

NAME = "sglang.example.test"


class _Answers:
    def __init__(self) -> None:
        self.now: frozenset[str] = frozenset()

    async def addresses(self, host: str) -> frozenset[str]:
        assert host == NAME
        return self.now


def test_the_reason_is_set_before_the_last_member_leaves():
    pools = Pools()
    joined: list[str] = []
    seen_when_leaving: list[str | None] = []

    async def leave(name: str) -> None:
        seen_when_leaving.append(pools.why_empty.get("m"))
        await asyncio.sleep(0)  # a retirement awaits: a request can come in meanwhile

    async def scenario() -> None:
        discovery = Discovery(DiscoverySection(), pools, lambda e: joined.append(e.name), leave)
        answers = _Answers()
        discovery.resolver = answers
        discovery.add(BackendEntry(name="k", url=f"http://{NAME}:30000", model="m", discover="dns"))
        found = discovery.entries["k"]
        assert "has not been resolved yet" in pools.why_empty["m"]

        answers.now = frozenset({"10.0.0.2", "10.0.0.3"})
        await found.resolve_once()
        assert joined == ["k~10.0.0.2", "k~10.0.0.3"] and "m" not in pools.why_empty

        answers.now = frozenset({"10.0.0.3"})  # one leaves, one stays: the model has a backend
        await found.resolve_once()
        assert seen_when_leaving == [None]

        answers.now = frozenset()  # the last one leaves: the reason is there as it goes
        await found.resolve_once()
        assert seen_when_leaving[1] is not None and "resolves to no address" in seen_when_leaving[1]
        assert NAME in seen_when_leaving[1] and found.members == {}

    asyncio.run(scenario())
