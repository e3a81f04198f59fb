"""Backends that follow a DNS name: `discover = "dns"` on a `[[backends]]` entry.

The entry's URL names a host (a Kubernetes headless Service, `clusterIP: None`, whose name resolves
to the address of every ready pod it selects) and each address it resolves to is a backend of its
own, a *member*, named `NAME~ADDRESS` (`k26-dflash~10.0.0.5`; `~` is a character configured names
may not hold, so a member's name is never another backend's) with the entry's URL, port, path,
model, strategy and key. The name is resolved again every `discovery.resolve_s`:

- an address that appears joins the pool after its first readiness check passes (as a backend
  added by a reload does);
- one that disappears leaves the pool at once and drains: the requests in flight on it finish,
  then its connections close (as a backend removed by a reload);
- a lookup that fails (no answer in time, a server failure) changes nothing: the members stay
  until the name is answered again. A name that does not exist, or has no address, is an answer:
  every member leaves. The entry stays, with no members; its model stays served, and a request
  for it is answered 503 saying which name resolved to nothing (`Pools.why_empty`).

Two resolvers: the system's (`getaddrinfo`, run by the event loop in a thread: /etc/hosts,
resolv.conf and its search domains, what every other program in the pod sees), or, with
`discovery.nameservers`, the named DNS servers asked directly (dnspython), the name as written.

Why DNS rather than the Kubernetes API (SGLang's router watches pods by label selector): a name is
what Envoy and Prometheus follow too, it needs no service account allowed to list pods, and it works
wherever a name lists the servers (Consul, a zone file), not only on Kubernetes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit, urlunsplit

import msgspec

from gateway.config import MEMBER_SEPARATOR, BackendEntry, DiscoverySection, nameserver_address

if TYPE_CHECKING:
    from gateway.pool import Pools

__all__ = ["Discovery", "LookupFailed", "Resolver", "member_entry", "resolver_for"]

log = logging.getLogger("specroute.discovery")

# The most members one entry takes (the addresses sorted, the first kept): each is a backend with
# its own pollers and connections, and a name can list any number of addresses.
MAX_MEMBERS = 256
_NO_ADDRESS_PROBLEM = "resolves to no address"


class LookupFailed(Exception):
    """The name could not be resolved now (no answer, a server failure): not an empty answer."""


class Resolver(Protocol):
    async def addresses(self, host: str) -> frozenset[str]:
        """Every IPv4 and IPv6 address of `host` (empty: it has none, or does not exist);
        LookupFailed when there is no answer."""
        ...


class SystemResolver:
    """getaddrinfo, as every program in the pod resolves names."""

    async def addresses(self, host: str) -> frozenset[str]:
        literal = _literal(host)
        if literal is not None:
            return literal
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            if e.errno in _NO_ADDRESS:
                return frozenset()
            raise LookupFailed(f"{host}: {e.strerror or e}") from None
        # a link-local IPv6 address carries its interface (fe80::1%eth0): not one a URL can name
        return frozenset(str(info[4][0]) for info in infos if "%" not in str(info[4][0]))


# getaddrinfo's answers that the name has no address (it does not exist, or has no A/AAAA record).
_NO_ADDRESS = {socket.EAI_NONAME, *([socket.EAI_NODATA] if hasattr(socket, "EAI_NODATA") else [])}


class DirectResolver:
    """The named DNS servers, asked for A and AAAA records (dnspython), the name as written."""

    def __init__(self, nameservers: Iterable[tuple[str, int]], timeout_s: float) -> None:
        import dns.asyncresolver
        import dns.nameserver

        self._resolver = dns.asyncresolver.Resolver(configure=False)
        self._resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in nameservers]
        self._resolver.lifetime = timeout_s

    async def addresses(self, host: str) -> frozenset[str]:
        literal = _literal(host)
        if literal is not None:
            return literal
        a, aaaa = await asyncio.gather(self._query(host, "A"), self._query(host, "AAAA"))
        return a | aaaa

    async def _query(self, host: str, rdtype: str) -> frozenset[str]:
        import dns.exception
        import dns.resolver

        try:
            answer = await self._resolver.resolve(host, rdtype, search=False, raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            return frozenset()
        except dns.exception.DNSException as e:  # a timeout, every server failing
            raise LookupFailed(f"{host} {rdtype}: {e}") from None
        return frozenset(str(r.address) for r in answer.rrset) if answer.rrset is not None else frozenset()


def _literal(host: str) -> frozenset[str] | None:
    try:
        return frozenset([str(ipaddress.ip_address(host))])
    except ValueError:
        return None


def resolver_for(section: DiscoverySection) -> Resolver:
    if not section.nameservers:
        return SystemResolver()
    servers = [nameserver_address(s) for s in section.nameservers]
    return DirectResolver([s for s in servers if s is not None], section.resolve_timeout_s)


def member_entry(entry: BackendEntry, address: str) -> BackendEntry:
    """The backend that `entry`'s address `address` is: its URL with the address for the host."""
    parts = urlsplit(entry.url)
    host = f"[{address}]" if ":" in address else address
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    userinfo, at, _ = parts.netloc.rpartition("@")
    url = urlunsplit(parts._replace(netloc=f"{userinfo}{at}{netloc}"))
    return msgspec.structs.replace(entry, name=f"{entry.name}{MEMBER_SEPARATOR}{address}", url=url, discover="none")


class DiscoveredEntry:
    """One `discover = "dns"` entry and its members, kept by one task."""

    def __init__(self, entry: BackendEntry, discovery: Discovery) -> None:
        self.entry = entry
        self.discovery = discovery
        self.host = urlsplit(entry.url).hostname or ""
        self.members: dict[str, str] = {}  # address -> member name
        self.lookups = 0
        self.failures = 0  # lookups that got no answer
        self.problem: str | None = None  # why it has no members, when it has none
        self.resolved = asyncio.Event()  # the first lookup is done (answered or not)
        self._failing = False
        self._lock = asyncio.Lock()  # a change of members, or the stop: one at a time
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"discover-{self.entry.name}")

    async def stop(self) -> list[str]:
        """Stops following the name; returns the members' names (still in the pool: the caller retires them)."""
        async with self._lock:  # not in the middle of a change
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None
        return list(self.members.values())

    async def _run(self) -> None:
        while True:
            try:
                await self.resolve_once()
            except Exception:  # a bug: never the end of following the name
                log.exception("discovering backends of %s failed", self.entry.name)
            self.resolved.set()
            await asyncio.sleep(self.discovery.section.resolve_s)

    async def resolve_once(self) -> None:
        section = self.discovery.section
        self.lookups += 1
        try:
            addresses = await asyncio.wait_for(self.discovery.resolver.addresses(self.host), section.resolve_timeout_s)
        except (LookupFailed, TimeoutError) as e:
            self.failures += 1
            reason = str(e) or f"no answer within {section.resolve_timeout_s:g}s (discovery.resolve_timeout_s)"
            if not self._failing:
                log.error(
                    "backends entry %s: DNS name %s could not be resolved (%s): its %d member(s) stay as they were",
                    self.entry.name,
                    self.host,
                    reason,
                    len(self.members),
                )
                self._failing = True
            if not self.members:
                self._set_problem(f"could not be resolved ({reason})")
            return
        if self._failing:
            log.warning("backends entry %s: DNS name %s resolves again", self.entry.name, self.host)
            self._failing = False
        async with self._lock:
            await self._follow(addresses)

    async def _follow(self, addresses: frozenset[str]) -> None:
        wanted = sorted(addresses)
        if len(wanted) > MAX_MEMBERS:
            log.warning(
                "backends entry %s: %s has %d addresses, only the first %d are members",
                self.entry.name,
                self.host,
                len(wanted),
                MAX_MEMBERS,
            )
            wanted = wanted[:MAX_MEMBERS]
        joined = [a for a in wanted if a not in self.members]
        staying = set(wanted)
        left = [(a, name) for a, name in self.members.items() if a not in staying]
        for address, _ in left:
            del self.members[address]
        for address in joined:
            member = member_entry(self.entry, address)
            self.members[address] = member.name
            log.warning(
                "backends entry %s: %s joined %s: %s, in the pool once ready",
                self.entry.name,
                address,
                self.host,
                member.name,
            )
            self.discovery.join(member)
        # why the model may be left with no backend is said before the last member leaves the pool:
        # a request that finds the pool empty must find the reason with it
        if self.members:
            self._set_problem(None)
        else:
            if self.problem != _NO_ADDRESS_PROBLEM:  # logged once, as it starts
                log.error(
                    "backends entry %s: DNS name %s resolves to no address: model %s has no backend from it",
                    self.entry.name,
                    self.host,
                    self.entry.model,
                )
            self._set_problem(_NO_ADDRESS_PROBLEM)
        for address, name in left:
            log.warning("backends entry %s: %s left %s: %s drains", self.entry.name, address, self.host, name)
            await self.discovery.leave(name)

    def _set_problem(self, problem: str | None) -> None:
        self.problem = problem
        self.discovery.noted(self.entry.model)


class Discovery:
    """Every `discover = "dns"` entry of the running config. `join` adds a member to the pool (out of
    it until its first readiness check passes), `leave` retires one."""

    def __init__(
        self,
        section: DiscoverySection,
        pools: Pools,
        join: Callable[[BackendEntry], object],
        leave: Callable[[str], Awaitable[None]],
    ) -> None:
        self.section = section
        self.resolver = resolver_for(section)
        self.pools = pools
        self.join = join
        self.leave = leave
        self.entries: dict[str, DiscoveredEntry] = {}
        self._running = False

    def configure(self, section: DiscoverySection) -> None:
        """New settings (reload): the period at the next wait, the servers at the next lookup."""
        old = self.section
        if section.nameservers != old.nameservers or section.resolve_timeout_s != old.resolve_timeout_s:
            self.resolver = resolver_for(section)
        self.section = section

    def add(self, entry: BackendEntry) -> None:
        self.entries[entry.name] = found = DiscoveredEntry(entry, self)
        self.pools.keep(entry.model)
        found.problem = "has not been resolved yet"
        self.noted(entry.model)
        if self._running:
            found.start()

    async def remove(self, name: str) -> list[str]:
        """Stops following entry `name`; returns its members' names, for the caller to retire."""
        found = self.entries.pop(name)
        members = await found.stop()
        self.pools.release(found.entry.model)
        self.noted(found.entry.model)
        return members

    def owner(self, backend: str) -> str | None:
        """The entry whose member `backend` is, or None."""
        for name, found in self.entries.items():
            if backend in found.members.values():
                return name
        return None

    async def settled(self, name: str, timeout_s: float) -> list[str]:
        """Entry `name`'s members once its first lookup is done (at most `timeout_s`)."""
        found = self.entries.get(name)
        if found is None:
            return []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(found.resolved.wait(), timeout_s)
        return list(found.members.values())

    def noted(self, model: str) -> None:
        """Why `model` may have no backend, as a 503 for it says (`Pools.why_empty`)."""
        notes = [
            f'backends entry {f.entry.name!r} discovers them from DNS name {f.host!r} (discover = "dns"), '
            f"which {f.problem} (as of {time.strftime('%H:%M:%S')})"
            for f in self.entries.values()
            if f.entry.model == model and not f.members and f.problem
        ]
        if notes:
            self.pools.why_empty[model] = "; ".join(notes)
        else:
            self.pools.why_empty.pop(model, None)

    def start(self) -> None:
        self._running = True
        for found in self.entries.values():
            found.start()

    async def stop(self) -> None:
        self._running = False
        for found in self.entries.values():
            await found.stop()
