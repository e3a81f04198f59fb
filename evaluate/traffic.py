"""Traffic for `specroute plan` and `specroute eval --traffic`: a named scenario, a recorded
trace or a file of phases.

Named: any open-loop evaluation scenario (`day`, `open-poisson`, `open-bursty`, `sessions`,
`offprior`, `agentic`); its loads are fractions of the reference capacity of N servers
(`evaluate.capacity`).

Trace: `trace:PATH` (`trace_traffic`): one phase that replays the trace's window on the virtual
clock at the trace's own arrival times (`evaluate.sources.TraceSource`), standing for the window's
length; its rate is the trace's, whatever the fleet.

File: JSON Lines, one object per line; blank lines and lines starting with `#` are skipped.
An optional first object `{"settings": {...}}` sets `reference` (profile the `load`s refer to,
default k26-dflash), `min_tokens`/`max_tokens` (answer length range, default 384/640),
`max_queued` (SGLang --max-queued-requests per server, default 128). Every other line is a phase:

    {"name": "night", "hours": 6, "rate": 2.5, "arrival": "poisson",
     "domains": {"math": 1, "code": 2, "chat": 1},
     "mix": {"chat": 0.2, "agent": 0.4, "thinking": 0.5, "temperatures": [[0.0, 0.5], [1.0, 0.5]],
             "long_context": 0.2}}

- `rate` (requests/s) or `load` (fraction of the reference capacity of the planned fleet size);
- `hours` (or `minutes`): how much of the day the phase stands for (default 1 hour);
- `arrival`: poisson (default) or bursty; `domains` default all three equally; `mix` takes the
  fields of `evaluate.workload.Mix` (default: single greedy requests);
- `sample_s`: simulated seconds of the phase's steady traffic (default: the planner's).

Every error names the file and the line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec

from evaluate.scenarios import K26_POOL, OPERATOR_MAX_QUEUED, SCENARIOS, Phase, Scenario
from evaluate.sources import TraceSource
from evaluate.workload import Mix
from loadgen.trace_dataset import TRACE_DOMAIN, TraceOptions
from loadgen.trace_file import TraceError

__all__ = ["TRACE_PREFIX", "Traffic", "TrafficError", "load_traffic", "named_traffic", "trace_traffic", "traffic_names"]

TRACE_PREFIX = "trace:"

DEFAULT_SAMPLE_S = 120.0
_PHASE_KEYS = {"name", "hours", "minutes", "rate", "load", "arrival", "domains", "mix", "sample_s"}


class TrafficError(ValueError):
    pass


class _Settings(msgspec.Struct, kw_only=True):
    reference: str = "k26-dflash"
    min_tokens: int = 384
    max_tokens: int = 640
    max_queued: int | None = 128


_SETTINGS_KEYS = set(_Settings.__struct_fields__)


class Traffic(msgspec.Struct, frozen=True, kw_only=True):
    """Phases to plan for. `rates[i]` is phase i's absolute requests/s, or None when the phase
    states a `load` (then it scales with the reference capacity of the planned fleet size)."""

    name: str
    scenario: Scenario  # the phases; its pool is replaced by each candidate fleet
    rates: tuple[float | None, ...]

    def rate_of(self, i: int, n_servers: int) -> float:
        from evaluate.capacity import reference_rate

        r = self.rates[i]
        ph = self.scenario.phases[i]
        if r is None and isinstance(ph.source, TraceSource):
            return ph.source.rate  # a trace arrives at its own rate, whatever the fleet
        return r if r is not None else ph.load * reference_rate(self.scenario, ph, n_servers)


def traffic_names() -> list[str]:
    return [n for n, s in SCENARIOS.items() if s.phases and all(p.open_loop for p in s.phases)]


def named_traffic(name: str) -> Traffic:
    if name not in traffic_names():
        raise TrafficError(f"unknown traffic {name!r} (named: {', '.join(traffic_names())}; or a file path)")
    s = SCENARIOS[name]
    return Traffic(name=name, scenario=s, rates=tuple(None for _ in s.phases))


def _number(where: str, obj: dict[str, Any], key: str, *, positive: bool = True) -> float | None:
    if key not in obj:
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise TrafficError(f"{where}: {key} must be a positive number, got {v!r}")
    return float(v)


def _phase(where: str, obj: dict[str, Any], index: int) -> tuple[Phase, float | None]:
    unknown = sorted(set(obj) - _PHASE_KEYS)
    if unknown:
        raise TrafficError(f"{where}: unknown key {unknown[0]!r} (phase keys: {', '.join(sorted(_PHASE_KEYS))})")
    rate, load = _number(where, obj, "rate"), _number(where, obj, "load")
    if (rate is None) == (load is None):
        raise TrafficError(f"{where}: give exactly one of rate (requests/s) or load (fraction of capacity)")
    hours, minutes = _number(where, obj, "hours"), _number(where, obj, "minutes")
    if hours is not None and minutes is not None:
        raise TrafficError(f"{where}: give hours or minutes, not both")
    span = hours * 3600 if hours is not None else minutes * 60 if minutes is not None else 3600.0
    sample = _number(where, obj, "sample_s") or DEFAULT_SAMPLE_S
    name = obj.get("name", f"phase-{index}")
    if not isinstance(name, str) or not name:
        raise TrafficError(f"{where}: name must be a non-empty string")
    try:
        mix = _typed(obj, "mix", Mix | None, None)
        phase = Phase(
            name=name,
            duration_s=sample,
            arrival=_typed(obj, "arrival", str, "poisson"),
            load=load if load is not None else 1.0,
            domains=_typed(obj, "domains", dict[str, float], {"math": 1.0, "code": 1.0, "chat": 1.0}),
            mix=mix,
            represents_s=span,
        )
        if phase.arrival == "closed":
            raise ValueError("plan traffic is open loop: arrival is poisson or bursty")
        phase.validate()
    except (msgspec.ValidationError, ValueError, TypeError) as e:
        raise TrafficError(f"{where}: {e}") from None
    return phase, rate


def _typed(obj: dict[str, Any], key: str, typ: Any, default: Any) -> Any:
    """`obj[key]` as `typ` (or `default` when absent); a ValueError naming the key otherwise."""
    if key not in obj:
        return default
    try:
        return msgspec.convert(obj[key], typ)
    except msgspec.ValidationError as e:
        raise ValueError(f"{key}: {e}") from None


def trace_traffic(path: str, options: TraceOptions | None = None) -> Traffic:
    """One phase replaying the trace at `path` (its window, sample and speed-up in `options`) on
    the K2.6 seed pool; TrafficError names the file and line of a bad trace."""
    source = TraceSource(path=path, options=options or TraceOptions())
    try:
        source.options.validate()
        trace = source.trace
    except TraceError as e:
        raise TrafficError(str(e)) from None
    sel = source.options.selection
    window = f"{sel.start_s:g}-{sel.start_s + trace.window_s:g} s"
    phase = Phase(
        name="trace",
        duration_s=source.duration_s,
        arrival="trace",
        domains={TRACE_DOMAIN: 1.0},
        source=source,
        represents_s=trace.window_s,
    )
    name = f"trace:{Path(path).stem}"
    sample = f", conversations {sel.sample[1]} mod {sel.sample[0]}" if sel.sample else ""
    scenario = Scenario(
        name=name,
        description=f"{len(trace.rows)} requests of {path} ({trace.format}, {window}{sample}) at {sel.speedup:g}x, "
        f"{100 * source.options.thinking_share:.0f}% thinking",
        pool=K26_POOL,
        phases=(phase,),
        max_queued=OPERATOR_MAX_QUEUED,
    )
    scenario.validate()
    return Traffic(name=name, scenario=scenario, rates=(source.rate,))


def load_traffic(spec: str, trace_options: TraceOptions | None = None) -> Traffic:
    """A named traffic, `trace:PATH`, or a JSONL file (an existing path or anything with a slash
    or .jsonl)."""
    if spec.startswith(TRACE_PREFIX):
        return trace_traffic(spec[len(TRACE_PREFIX) :], trace_options)
    path = Path(spec)
    if spec in traffic_names() and not path.exists():
        return named_traffic(spec)
    if not path.exists():
        if "/" in spec or spec.endswith((".jsonl", ".json")):
            raise TrafficError(f"{spec}: no such traffic file")
        return named_traffic(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TrafficError(f"{spec}: cannot read: {e}") from None
    settings = _Settings()
    settings_at = spec
    phases: list[Phase] = []
    rates: list[float | None] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{spec}:{lineno}"
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise TrafficError(f"{where}: not JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TrafficError(f"{where}: each line is a JSON object")
        if "settings" in obj:
            if phases or settings_at != spec or len(obj) != 1 or not isinstance(obj["settings"], dict):
                raise TrafficError(f'{where}: a settings object comes first, alone: {{"settings": {{...}}}}')
            unknown = sorted(set(obj["settings"]) - _SETTINGS_KEYS)
            if unknown:
                raise TrafficError(f"{where}: unknown setting {unknown[0]!r} ({', '.join(sorted(_SETTINGS_KEYS))})")
            try:
                settings = msgspec.convert(obj["settings"], _Settings)
            except msgspec.ValidationError as e:
                raise TrafficError(f"{where}: settings: {e}") from None
            settings_at = where
            continue
        ph, rate = _phase(where, obj, len(phases))
        if any(p.name == ph.name for p in phases):
            raise TrafficError(f"{where}: phase name {ph.name!r} used twice")
        phases.append(ph)
        rates.append(rate)
    if not phases:
        raise TrafficError(f"{spec}: no phases (one JSON object per line)")
    where = settings_at
    try:
        scenario = Scenario(
            name=path.stem,
            description=f"traffic file {spec}",
            pool=("k26-dflash",),
            phases=tuple(phases),
            min_tokens=settings.min_tokens,
            max_tokens=settings.max_tokens,
            max_queued=settings.max_queued,
            reference=settings.reference,
            streams_by_phase_name=True,
        )
        scenario.validate()
        from evaluate.fleet import parse_member

        parse_member(scenario.reference)
    except (ValueError, TypeError) as e:
        raise TrafficError(f"{where}: {e}") from None
    return Traffic(name=path.stem, scenario=scenario, rates=tuple(rates))
