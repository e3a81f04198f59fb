"""gateway/discovery.py without child processes (so on the dependency floors too): the direct
resolver against a DNS server served on loopback in this process with dnspython's own message
code, how an entry's members follow the answers, and the system resolver. The config's checks:
tests/unit/test_discovery_config.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import dns.message
import dns.rcode
import dns.rrset
import pytest

from gateway.config import BackendEntry, DiscoverySection
from gateway.discovery import Discovery, LookupFailed, SystemResolver, resolver_for
from gateway.pool import Pools

NAME = "sglang.specroute.test."


class _Zone(asyncio.DatagramProtocol):
    """Answers A and AAAA queries from `records` (name -> addresses); NXDOMAIN for names not in it;
    nothing at all while `silent`."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {}
        self.silent = False
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.silent or self.transport is None:
            return
        query = dns.message.from_wire(data)
        response = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text()
        if name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            kind = dns.rdatatype.to_text(question.rdtype)
            matching = [a for a in self.records[name] if (":" in a) == (kind == "AAAA")]
            if matching:
                response.answer.append(dns.rrset.from_text(name, 0, "IN", kind, *matching))
        self.transport.sendto(response.to_wire(), addr)


@contextlib.asynccontextmanager
async def _zone() -> AsyncIterator[tuple[_Zone, int]]:
    zone = _Zone()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: zone, local_addr=("127.0.0.1", 0))
    try:
        yield zone, transport.get_extra_info("sockname")[1]
    finally:
        transport.close()


ENTRY = BackendEntry(name="k26", url=f"http://{NAME.rstrip('.')}:30000/v1x", model="kimi-k2.6", discover="dns")


def test_members_follow_the_answers_and_no_answer_keeps_them():
    async def scenario() -> None:
        async with _zone() as (zone, port):
            section = DiscoverySection(resolve_s=3600, nameservers=[f"127.0.0.1:{port}"], resolve_timeout_s=0.5)
            pools = Pools()
            joined: list[BackendEntry] = []
            left: list[str] = []

            async def leave(name: str) -> None:
                left.append(name)

            discovery = Discovery(section, pools, joined.append, leave)
            discovery.add(ENTRY)
            assert pools.by_model == {"kimi-k2.6": []} and "not been resolved yet" in pools.why_empty["kimi-k2.6"]
            found = discovery.entries["k26"]

            zone.records[NAME] = ["10.0.0.5", "fd00::7"]
            await found.resolve_once()
            assert sorted((m.name, m.url) for m in joined) == [
                ("k26~10.0.0.5", "http://10.0.0.5:30000/v1x"),
                ("k26~fd00::7", "http://[fd00::7]:30000/v1x"),
            ]
            assert {m.discover for m in joined} == {"none"} and "kimi-k2.6" not in pools.why_empty

            zone.records[NAME] = ["10.0.0.6", "fd00::7"]
            await found.resolve_once()
            assert left == ["k26~10.0.0.5"] and joined[-1].name == "k26~10.0.0.6"
            assert discovery.owner("k26~10.0.0.6") == "k26" and discovery.owner("k26~10.0.0.5") is None

            zone.silent = True  # no answer is not an empty answer: the members stay
            await found.resolve_once()
            assert found.failures == 1 and len(found.members) == 2 and len(left) == 1

            zone.silent = False
            del zone.records[NAME]  # NXDOMAIN: an answer, every member leaves; the model stays, saying why
            await found.resolve_once()
            assert sorted(left) == ["k26~10.0.0.5", "k26~10.0.0.6", "k26~fd00::7"] and found.members == {}
            assert pools.by_model == {"kimi-k2.6": []}
            assert f"DNS name {NAME.rstrip('.')!r}" in pools.why_empty["kimi-k2.6"]
            assert "resolves to no address" in pools.why_empty["kimi-k2.6"]

            assert await discovery.remove("k26") == []
            assert pools.by_model == {} and pools.why_empty == {}

    asyncio.run(scenario())


def test_the_system_resolver_and_literals():
    async def scenario() -> None:
        resolver = SystemResolver()
        assert "127.0.0.1" in await resolver.addresses("localhost")
        assert await resolver.addresses("10.1.2.3") == {"10.1.2.3"}
        assert await resolver.addresses("::1") == {"::1"}
        direct = resolver_for(DiscoverySection(nameservers=["127.0.0.1:9"], resolve_timeout_s=0.2))
        assert await direct.addresses("192.0.2.1") == {"192.0.2.1"}  # a literal asks nobody
        with pytest.raises(LookupFailed):  # nothing listens there: no answer
            await direct.addresses("sglang.specroute.test")

    asyncio.run(scenario())
