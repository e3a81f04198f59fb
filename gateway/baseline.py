"""The yardstick of `speedup`: how fast the autoregressive backend would have decoded this request.

Speedup of a request = its decode tok/s / the AR backend's expected decode tok/s at the same load
(`docs/metrics.md`). The expectation is a live estimate learned from the pool's AR backend's finished
requests (policies.estimates: step time per load, first observation replaces the prior), or the
AR prior of docs/studies.md (R1-R3) when the pool has no AR backend. It is kept apart from any policy's
estimates, so the yardstick does not depend on which policy is configured.
"""

from __future__ import annotations

from backends import Strategy
from gateway.pool import Backend, Pools
from policies import Domain, Outcome
from policies.estimates import Estimates
from policies.priors import DOMAIN_INDEX


class SpeedupBaseline:
    def __init__(self, pools: Pools) -> None:
        self.estimates = Estimates()
        self._reference: dict[str, str] = {}  # model -> name of the estimate used as its AR baseline
        self._ar_backends: set[str] = set()
        for backends in pools.by_model.values():
            for b in backends:
                self.register(b)

    def register(self, backend: Backend) -> None:
        """A backend joined its pool: the first AR backend of a model becomes that model's yardstick."""
        model = backend.spec.model
        if backend.spec.strategy is Strategy.AR:
            self._ar_backends.add(backend.name)
            self.estimates.register(backend.name, Strategy.AR)
            if self._reference.get(model, "ar-prior:").startswith("ar-prior:"):
                self._reference[model] = backend.name
        elif model not in self._reference:
            self._reference[model] = f"ar-prior:{model}"
            self.estimates.register(self._reference[model], Strategy.AR)

    def observe(self, outcome: Outcome) -> None:
        if outcome.backend in self._ar_backends:
            self.estimates.observe(outcome)

    def __call__(self, model: str, domain: str, load: int) -> float | None:
        est = self.estimates.get(self._reference.get(model, ""))
        if est is None:
            return None
        return est.rate(DOMAIN_INDEX[Domain(domain)], max(1, load))
