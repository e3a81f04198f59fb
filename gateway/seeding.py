"""At startup, measure every backend briefly and seed the policies with what it measured.

The goodput policy's priors are the studies' figures; a backend on other hardware, another model or
another drafter setting would start with a head start or a handicap it does not have. Each backend
gets a short measurement (`backends.measure`: three greedy requests and one long prompt, a few
seconds on real K2.6 servers) on its own pooled client, all backends at once, in the background:
requests arriving meanwhile are routed by the priors, and each backend's estimates switch to its
measurement as soon as it is in. A backend that cannot be measured keeps its prior (logged). Set
`SPECROUTE_MEASURE_BACKENDS=0` to skip it (the priors then stand until telemetry corrects them).
Backends added later (reload, admin API) are learned from telemetry alone, and a pool whose backends
all share one strategy is not measured (they all start from the same prior: no head start).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine, Iterable
from typing import Any

import aiohttp

from backends.client import SGLangClient
from backends.measure import MeasurementFailed, measure
from policies import Policy, Seedable

log = logging.getLogger("specroute.seeding")

__all__ = ["start_seeding"]


def _enabled() -> bool:
    return os.environ.get("SPECROUTE_MEASURE_BACKENDS", "1").strip().lower() not in ("0", "false", "no", "off")


async def _seed_one(client: SGLangClient, policy: Seedable) -> None:
    spec = client.spec
    try:
        m = await measure(client, speculative=spec.strategy.speculative)
    except (MeasurementFailed, aiohttp.ClientError, OSError, ValueError) as e:  # TimeoutError is an OSError
        log.warning(
            "backend %s could not be measured at startup (%s); its policy keeps the strategy prior", spec.name, e
        )
        return
    policy.seed(spec, m)
    log.info(  # a normal start; what it seeded shows in GET /admin/backends
        "backend %s measured at startup: step %s ms, accept %s, prefill %s ms/1k tokens",
        spec.name,
        None if m.step_s is None else round(m.step_s * 1000, 2),
        {d: round(a, 2) for d, a in m.accept_length.items()},
        None if m.prefill_per_token_s is None else round(m.prefill_per_token_s * 1e6, 1),
    )


def start_seeding(clients: Iterable[SGLangClient], policies: dict[str, Policy]) -> asyncio.Task[None] | None:
    """Measure each backend in the background on its client and seed its model's policy; None when
    disabled or when no pool needs it."""
    if not _enabled():
        return None
    # Only pools whose policy learns from a measurement and that mix strategies: in a pool of one
    # strategy every backend starts from the same prior, so there is no head start to remove, and
    # its backends are spared the extra requests.
    clients = list(clients)
    strategies: dict[str, set[str]] = {}
    for c in clients:
        strategies.setdefault(c.spec.model, set()).add(c.spec.strategy.value)
    jobs: list[Coroutine[Any, Any, None]] = []
    for c in clients:
        policy = policies.get(c.spec.model)
        if isinstance(policy, Seedable) and len(strategies[c.spec.model]) > 1:
            jobs.append(_seed_one(c, policy))
    if not jobs:
        return None

    async def run() -> None:
        await asyncio.gather(*jobs, return_exceptions=True)

    return asyncio.create_task(run())
