"""The clairvoyant reference: the goodput decision rule fed with the twin's true parameters.

It answers the same questions as `policies.estimates.BackendEstimate` (acceptance per cell,
step time at a load, prefill time; `policies.cost.CostModel`) from the engine itself: its
step-time function (with the KV its running requests read), its acceptance per cell (domain,
temperature band, context band) and its prefill cost, including a live fault scale. Comparing
the goodput policy with it measures learning quality only, since both share the decision rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from backends import BackendSpec, Strategy
from policies.base import Outcome
from policies.estimates import RateModel
from policies.priors import (
    CELLS_PER_DOMAIN,
    CONTEXT_BANDS,
    COPY_BANDS,
    DOMAINS,
    LONG_CONTEXT_TOKENS,
    TEMPERATURE_BANDS,
)
from twin.domain import prompt_key
from twin.engine import Engine

__all__ = ["OracleEstimates", "OracleModel", "true_accept_length"]


_PROMPTS = 256
_KEYS = [prompt_key(f"clairvoyant-{i}") for i in range(_PROMPTS)]
# What a cell stands for when the truth is asked per cell: a temperature inside each band, and a
# context inside each context band (short: a typical prompt; long: a long document).
_BAND_TEMPERATURE = (0.0, 0.6, 1.0)
_BAND_CONTEXT = (500, 4 * LONG_CONTEXT_TOKENS)


def true_accept_length(engine: Engine, domain: str, temperature: float = 0.0, context_tokens: int = 0) -> float:
    """Expected tokens per verify pass (accepted drafts + bonus) of a prompt of `domain`:
    1 + sum_{j=1..m} p^j for the engine's truncated geometric law, averaged over the engine's
    per-prompt acceptance (`accept_prob` on 256 fixed prompt keys, so whatever variation model
    the twin uses is followed), p scaled by the fault knob."""
    m = engine.profile.max_accept_drafts
    if not m:
        return 1.0
    scale = getattr(engine, "accept_scale", 1.0)
    total = 0.0
    for key in _KEYS:
        p = engine.accept_prob(domain, key, temperature=temperature, context_tokens=context_tokens) * scale
        p = min(max(p, 0.0), 0.999)
        total += 1.0 + (p * (1.0 - p**m) / (1.0 - p) if p < 1.0 else float(m))
    return total / _PROMPTS


class OracleModel(RateModel):
    """Duck-types BackendEstimate's lookups with the engine's truth."""

    __slots__ = (
        "name",
        "engine",
        "max_running",
        "seen",
        "last_chosen",
        "accept_n",
        "last_report",
        "_scale",
        "_accept",
        "_cells",
        "_steps",
        "_kv_at",
        "_kv_per_request",
    )
    observed = 1 << 20  # the truth is fully measured: never stood in for by a peer

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine
        self.max_running = engine.max_running
        self.seen = [1 << 20] * len(DOMAINS)  # fully known: no exploration bonus
        self.accept_n = [0.0] * len(DOMAINS)
        self.last_chosen = 0
        self.last_report: float | None = None
        self._scale: float | None = None
        self._accept = [1.0] * len(DOMAINS)
        self._cells = [1.0] * (len(DOMAINS) * CELLS_PER_DOMAIN)
        cap = engine.max_running
        self._steps = [engine.step_time(max(1, min(n, cap))) for n in range(0, 1025)]
        self._kv_at = -1.0  # busy time of the engine when the KV per request was last read
        self._kv_per_request = 0.0

    def set_max_running(self, max_running: int) -> None:
        pass

    def note_dispatch(self, d: int) -> None:
        pass

    def note_idle(self) -> None:
        pass

    def note_report(self, reported_accept: float, running: int | None) -> None:
        self.last_report = reported_accept

    # the server's own counters teach nothing to the truth
    last_moments: tuple[float, ...] | None = None
    last_prefill_counters: tuple[float, float] | None = None

    def note_counters(
        self,
        moments: tuple[float, ...] | None,
        prefill: tuple[float, float] | None,
        own: tuple[float, float, float] | None = None,
    ) -> None:
        pass

    @property
    def _acc(self) -> list[float]:  # type: ignore[override]  # RateModel's acceptance, kept current
        return self._accepts()

    def _accepts(self) -> list[float]:
        scale = getattr(self.engine, "accept_scale", 1.0)
        if scale != self._scale:
            self._scale = scale
            self._accept = [true_accept_length(self.engine, d.value) for d in DOMAINS]
            self._cells = [
                true_accept_length(self.engine, d.value, _BAND_TEMPERATURE[t], _BAND_CONTEXT[c])
                for d in DOMAINS
                for t in range(TEMPERATURE_BANDS)
                for c in range(CONTEXT_BANDS)
                # a copy turn's truth depends on what the server's trie holds, which no fixed
                # table knows: the reference prices it as its domain's text
                for _ in range(COPY_BANDS)
            ]
        return self._accept

    def accept_at(self, c: int) -> float:
        self._accepts()
        return self._cells[c]

    def step_s(self, load: int) -> float:
        """True step time at `load`, with the KV the engine's running requests read per request
        now (refreshed as the engine's busy time moves on)."""
        e = self.engine
        if not e.profile.step.kv_ns_per_token:
            return self._steps[load if load < 1024 else 1024]
        st = e.stats()
        if st.busy_s != self._kv_at:
            self._kv_at = st.busy_s
            self._kv_per_request = st.num_used_tokens / st.num_running if st.num_running else 0.0
        b = max(1, min(load, e.max_running))
        return e.step_time(b, kv_tokens=int(b * self._kv_per_request))

    def prefill_s(self, uncached: int, pairs: float = 0.0) -> float:
        return self.engine.prefill_time(uncached, 0, _cached_before(uncached, pairs))

    def prefill_stall_s(self, uncached: int, pairs: float = 0.0) -> float:
        return self.engine.prefill_time(uncached, 1, _cached_before(uncached, pairs))

    def describe(self) -> dict[str, Any]:
        return {
            "accept_length": {d.value: round(a, 3) for d, a in zip(DOMAINS, self._accepts(), strict=False)},
            "step_ms": {str(b): round(self.step_s(b) * 1000, 2) for b in (1, 2, 4, 8, 16, 32, 64, 128)},
        }


def _cached_before(uncached: int, pairs: float) -> int:
    """The cached prefix that `uncached` new tokens with `pairs` causal pairs follow (the inverse
    of `policies.prefill.causal_pairs`); 0 when the pairs are not given."""
    if uncached <= 0 or pairs <= 0:
        return 0
    return max(round(pairs / uncached - uncached / 2), 0)


class OracleEstimates:
    """Stands in for `policies.estimates.Estimates`: knows every engine, learns nothing."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.backends = {name: OracleModel(name, e) for name, e in engines.items()}
        self.used = 0
        self.skipped: dict[str, int] = {}

    def register(self, name: str, strategy: Strategy | str, max_running: int | None = None) -> OracleModel:
        try:
            return self.backends[name]
        except KeyError:
            raise KeyError(f"clairvoyant reference has no engine for backend {name!r}") from None

    def register_all(self, specs: Iterable[BackendSpec]) -> None:
        pass

    def stand_in(self, est: OracleModel) -> OracleModel:
        return est  # the truth needs no stand-in

    def observe(self, outcome: Outcome, copy: bool = False) -> bool:
        return True

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: m.describe() for name, m in self.backends.items()}
