"""Everything the gateway serves with, and how it changes without a restart.

`Runtime` owns the pools, admission, policies, proxy and poller built from a `Config`. `reload`
applies a new config in place: added backends start receiving traffic, removed ones leave the
pools at once and are retired (their in-flight streams finish, then their connections close),
changed policies and the tracing sample ratio apply to new requests, and the caps, timeouts and
retry settings are swapped. An invalid config is refused by `load_config` before anything
changes, so the old one stays. Backends of `discover = "dns"` entries come and go the same way as
their name's addresses do (gateway/discovery.py), and the config file is watched for changes
(gateway/config_watch.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from backends.client import SGLangClient
from gateway.access_log import AccessLog
from gateway.admission import Admission
from gateway.body_budget import BodyBudget
from gateway.circuit import CircuitBreaker
from gateway.config import BackendEntry, Config, ConfigError, config_digest, config_from_dict
from gateway.config_watch import ConfigWatch
from gateway.connections import ConnectionLimits
from gateway.discovery import Discovery
from gateway.metrics import GatewayMetrics, latency_buckets
from gateway.poller import Poller
from gateway.pool import Backend, Pools
from gateway.proxy import Proxy
from gateway.refusals import Refusals
from gateway.seeding import start_seeding
from gateway.tracing import Tracing
from gateway.via import VIA_ENTRY
from policies import Policy, TracksPrefixes, make_policy

log = logging.getLogger("specroute.runtime")


class Runtime:
    def __init__(self, config: Config, *, tracing: Tracing | None = None, access_log: AccessLog | None = None) -> None:
        self.config = config
        self.pools = Pools(max_ejected_share=config.health.max_ejected_share)
        a = config.admission
        self.admission = Admission(
            self.pools,
            max_inflight=a.max_inflight,
            max_queue=a.max_queue,
            queue_timeout_s=a.queue_timeout_s,
            priority_order=a.priority_order,
            default_priority=a.default_priority,
        )
        g, t = config.gateway, config.timeouts
        self.access_log = access_log or AccessLog(config.logging.access_log)
        self.refusals = Refusals(self.access_log)  # turned away at the door: counted and logged
        self.connection_limits = ConnectionLimits(g.max_connections, t.client_header_s, t.client_send_s)
        self.connection_limits.refusals = self.refusals
        self.body_budget = BodyBudget(g.max_body_bytes_in_flight)
        self.metrics = GatewayMetrics(latency_buckets(config))  # its buckets are fixed at start
        self.tracing = tracing or Tracing(config.tracing)
        self.policies: dict[str, Policy] = {}  # shared with the proxy: changed in place
        # How each model's policy was built (name, sorted options): an unchanged one is kept on reload.
        self._policy_builds: dict[str, tuple[str, list[tuple[str, Any]]]] = {}
        self.proxy = Proxy(
            self.pools,
            self.admission,
            self.policies,
            config,
            metrics=self.metrics,
            tracing=self.tracing,
            access_log=self.access_log,
        )
        self.poller = Poller(
            config.health,
            on_change=self.admission.kick,
            on_cache_lost=self._cache_lost,
            queue_order=lambda: self.admission.priority_order,
        )
        # Out of the pool, finishing their requests: a list, since a name can leave twice before
        # the first one is done (a URL changed, then changed back).
        self.retiring: list[Backend] = []
        # [models] sections of models whose last backend the admin API removed: back with one of theirs
        self._parked_sections: dict[str, Any] = {}
        self._retire_tasks: set[asyncio.Task[None]] = set()
        self._seeding: asyncio.Task[None] | None = None
        self._shutdown_timer: asyncio.TimerHandle | None = None
        self.discovery = Discovery(
            config.discovery, self.pools, lambda entry: self._add(entry, checked_first=True), self._retire
        )
        self.config_watch: ConfigWatch | None = None
        for entry in config.backends:
            if entry.discover == "dns":
                self.discovery.add(entry)
            else:
                self._add(entry)
        self._build_policies()
        self.metrics.watch(self.pools, self.admission, self.refusals, self._state_metrics)

    # ------------------------------------------------------------------ backends

    def _add(self, entry: BackendEntry, checked_first: bool = False) -> Backend:
        """`checked_first`: out of the pool until its first readiness check passes (a backend added
        to a running gateway; at start the gateway's own readiness waits for every first check)."""
        config = self.config
        spec = Config(backends=[entry]).backend_specs()[0]
        backend = Backend(
            spec,
            SGLangClient(
                spec,
                connections=config.gateway.upstream_connections,
                connect_timeout_s=config.timeouts.connect_s,
                headers={"Via": VIA_ENTRY},
            ),
            CircuitBreaker(
                config.health.circuit_failures,
                config.health.circuit_cooldown_s,
                max_cooldown_s=config.health.circuit_max_cooldown_s,
            ),
            cap=config.admission.backend_max_inflight,
        )
        if checked_first:
            backend.ready = False
            backend.refresh_view()
        self.pools.add(backend)
        self.poller.add(backend)
        self.proxy.baseline.register(backend)
        return backend

    async def _retire(self, name: str) -> None:
        """Out of the pools now; closed once its in-flight requests are done."""
        backend = self.pools.remove(name)
        backend.draining = True
        await self.poller.remove(name)
        self._cache_lost(name)  # no request goes there any more: what it holds is not an asset
        self.retiring.append(backend)
        task = asyncio.create_task(self._close_when_idle(backend))
        self._retire_tasks.add(task)
        task.add_done_callback(self._retire_tasks.discard)

    async def _close_when_idle(self, backend: Backend, poll_s: float = 0.05) -> None:
        # A poll, not an event: the count lives in the backend's leases, which signal nobody; this
        # runs once per removed backend, not per request.
        while backend.inflight > 0:  # noqa: ASYNC110
            await asyncio.sleep(poll_s)
        await backend.client.close()
        self.retiring.remove(backend)
        if backend.name not in self.pools.by_name and all(b.name != backend.name for b in self.retiring):
            self.proxy.metrics.forget_backend(backend.name)  # not back under the same name meanwhile
        log.warning("backend %s removed", backend.name)

    def _build_policies(self) -> None:
        """One policy per served model; a policy whose name and options did not change keeps what it learned."""
        wanted: dict[str, tuple[str, dict[str, Any]]] = {}
        for model in self.pools.models():
            name = self.config.policy_for(model)
            wanted[model] = (name, self.config.policy_options(model, name))
        for model, (name, options) in wanted.items():
            build = (name, sorted(options.items()))
            if model in self.policies and self._policy_builds.get(model) == build:
                continue
            self.policies[model] = make_policy(name, **options)
            self._policy_builds[model] = build
        for model in list(self.policies):
            if model not in wanted:
                del self.policies[model]
                self._policy_builds.pop(model, None)

    async def add_backend(self, data: dict[str, Any]) -> Backend:
        """Admin API: add one backend (same fields as a `[[backends]]` entry)."""
        if data.get("discover", "none") != "none":
            raise ConfigError(
                'backend: discover: a discover = "dns" entry is added through the config file (and a reload), '
                "not the admin API"
            )
        entries = [msgspec_entry(b) for b in self.config.backends] + [data]
        current = self._config_dict()
        sections = dict(current.get("models", {}))
        model = data.get("model")
        if isinstance(model, str) and model in self._parked_sections and model not in sections:
            sections[model] = self._parked_sections[model]
        new = config_from_dict({**current, "backends": entries, "models": sections}, "backend")
        self.config = new
        if isinstance(model, str):
            self._parked_sections.pop(model, None)
        backend = self._add(new.backends[-1], checked_first=True)
        self._build_policies()
        # Answer with the backend in or out of the pool, not as a guess: requests sent to it before
        # its first check would fail on a URL that does not answer.
        await self.poller.first_check(backend.name)
        self.admission.kick()
        return backend

    async def remove_backend(self, name: str) -> None:
        """Admin API: drain and remove; in-flight requests finish first."""
        if name not in self.pools.by_name:
            raise KeyError(name)
        entry = self.discovery.owner(name)
        if entry is not None:
            raise ConfigError(
                f'it is an address of backends entry {entry!r} (discover = "dns"), back at its next lookup: '
                f"drain it (POST /admin/backends/{name}/drain), or take its address out of the name"
            )
        entries = [msgspec_entry(b) for b in self.config.backends if b.name != name]
        models = {e["model"] for e in entries}
        current = self._config_dict()
        sections = {m: s for m, s in current.get("models", {}).items() if m in models}
        self.config = config_from_dict({**current, "backends": entries, "models": sections}, "backend")
        # a model left without backends keeps its section for when one comes back (a config must
        # not name a model nobody serves)
        self._parked_sections.update({m: s for m, s in current.get("models", {}).items() if m not in models})
        await self._retire(name)
        self._build_policies()

    # ------------------------------------------------------------------ reload

    def running(self, new: Config) -> Config:
        """`new` as this process can run it: its listener is the one it serves on (a new
        `gateway.listen` takes effect at the next start), so what depends on it (gateway.auth's
        posture) is judged on the address clients reach."""
        listen = self.config.gateway.listen
        if new.gateway.listen == listen:
            return new
        log.warning("gateway.listen changed to %s: takes effect at the next restart", new.gateway.listen)
        return msgspec.structs.replace(new, gateway=msgspec.structs.replace(new.gateway, listen=listen))

    async def reload(self, new: Config) -> dict[str, list[str]]:
        """Applies `new` (as `running` made it)."""
        self._parked_sections.clear()  # the file is the whole truth again
        old = {b.name: b for b in self.config.backends}
        fresh = {b.name: b for b in new.backends}
        removed = [n for n in old if n not in fresh or old[n] != fresh[n]]
        added = [n for n in fresh if n not in old or old[n] != fresh[n]]
        self.config = new
        self.poller.configure(new.health)
        self.discovery.configure(new.discovery)
        for name in removed:
            if old[name].discover == "dns":
                for member in await self.discovery.remove(name):
                    await self._retire(member)
            else:
                await self._retire(name)
        for name in added:
            if fresh[name].discover == "dns":
                self.discovery.add(fresh[name])
            else:
                self._add(fresh[name], checked_first=True)
        self._apply_settings(new)
        self._build_policies()
        await asyncio.gather(*(self._first_check(fresh[name]) for name in added))
        self.admission.kick()
        log.warning("config reloaded: added %s, removed %s", added, removed)
        return {"added": added, "removed": removed}

    async def _first_check(self, entry: BackendEntry) -> None:
        """Until `entry`'s backend had its first check; a discovered entry's first lookup, then its members'."""
        if entry.discover != "dns":
            await self.poller.first_check(entry.name)
            return
        members = await self.discovery.settled(entry.name, self.config.discovery.resolve_timeout_s + 1)
        await asyncio.gather(*(self.poller.first_check(m) for m in members))

    def watch_config(self, path: str | Path, reload: Callable[[], Awaitable[object]]) -> None:
        """Apply the config file with `reload` whenever it changes on disk (gateway/config_watch.py)."""
        self.config_watch = ConfigWatch(path, reload, lambda: self.config.gateway.config_watch_s)
        self.config_watch.start()

    def _state_metrics(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The config running, the file watch and the discovered entries, read at scrape time."""
        info = GaugeMetricFamily(
            "specroute_config_info",
            "The running config: 1, with its digest (equal on replicas that run the same file).",
            labels=["digest"],
        )
        info.add_metric([config_digest(self.config)], 1.0)
        yield info
        if self.config_watch is not None:
            yield GaugeMetricFamily(
                "specroute_config_file_applied",
                "1 when the running config is what the config file holds; 0 when the file changed and was "
                "refused, or is missing (the running config kept).",
                value=1.0 if self.config_watch.current else 0.0,
            )
        members = GaugeMetricFamily(
            "specroute_discovered_backends",
            'Addresses of a discover = "dns" entry\'s name in the pool.',
            labels=["entry"],
        )
        failures = CounterMetricFamily(
            "specroute_discovery_lookup_failures",
            'Lookups of a discover = "dns" entry\'s name that got no answer (its members kept).',
            labels=["entry"],
        )
        for name, found in self.discovery.entries.items():
            members.add_metric([name], len(found.members))
            failures.add_metric([name], found.failures)
        yield members
        yield failures

    def _apply_settings(self, new: Config) -> None:
        limits = self.connection_limits
        limits.max_connections = new.gateway.max_connections
        limits.header_timeout_s, limits.send_timeout_s = new.timeouts.client_header_s, new.timeouts.client_send_s
        self.body_budget.total = new.gateway.max_body_bytes_in_flight
        a = new.admission
        self.admission.max_inflight, self.admission.max_queue = a.max_inflight, a.max_queue
        self.admission.queue_timeout_s = a.queue_timeout_s
        self.admission.priority_order, self.admission.default_priority = a.priority_order, a.default_priority
        h = new.health
        self.pools.max_ejected_share = h.max_ejected_share
        for b in self.pools.by_name.values():
            b.cap_override = a.backend_max_inflight
            b.circuit.failures, b.circuit.cooldown_s = h.circuit_failures, h.circuit_cooldown_s
            b.circuit.max_cooldown_s = h.circuit_max_cooldown_s
        self.proxy.configure(new)
        self.tracing.configure(new.tracing)

    def _config_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.to_builtins(self.config)
        return data

    async def start(self) -> None:
        self.poller.start()
        self.discovery.start()
        # the first members of discovered entries are in the pool before the gateway serves
        timeout_s = self.config.discovery.resolve_timeout_s + 1
        await asyncio.gather(*(self.discovery.settled(name, timeout_s) for name in self.discovery.entries))
        # policies start from a short measurement of each backend, not the studies' priors
        self._seeding = start_seeding([b.client for b in self.pools.by_name.values()], self.policies)

    def _cache_lost(self, backend: str) -> None:
        """The backend may have lost its radix cache: no policy may count on the prefixes it held."""
        for policy in self.proxy.all_policies():
            if isinstance(policy, TracksPrefixes):
                policy.forget_prefixes(backend)

    def begin_shutdown(self, grace_s: float) -> None:
        """The server has stopped accepting: what is still being answered after `grace_s` is ended."""
        if self._shutdown_timer is None:
            self._shutdown_timer = asyncio.get_running_loop().call_later(grace_s, self._end_open_requests, grace_s)

    def _end_open_requests(self, grace_s: float) -> None:
        ended = self.proxy.shut_down_open_requests()
        if ended:
            log.warning("shutdown: %d request(s) still open after the grace period (%gs), ended", ended, grace_s)

    async def stop(self) -> None:
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
        if self.config_watch is not None:
            await self.config_watch.stop()
        await self.discovery.stop()
        await self.poller.stop()
        self.proxy.background.close()
        if self._seeding is not None:
            self._seeding.cancel()
        for task in list(self._retire_tasks):
            task.cancel()
        await self.pools.close()
        for b in self.retiring:
            await b.client.close()
        self.tracing.shutdown()
        self.proxy.access_log.close()


def msgspec_entry(entry: BackendEntry) -> dict[str, Any]:
    return {k: v for k, v in msgspec.to_builtins(entry).items() if v is not None}


__all__ = ["ConfigError", "Runtime"]
