"""Head sampling with the OpenTelemetry SDK's built-in samplers and its rules, without the SDK objects.

The request path decides once per trace, on the SERVER span; CLIENT spans follow their parent.
Names, defaults and arithmetic are the SDK's (`opentelemetry.sdk.trace.sampling`): OTEL_TRACES_SAMPLER
is one of always_on, always_off, traceidratio, parentbased_always_on (the default),
parentbased_always_off, parentbased_traceidratio, with OTEL_TRACES_SAMPLER_ARG the ratio; a ratio
keeps a trace when the low 64 bits of its id are below round(ratio * 2**64), so a trace sampled here
is sampled by every other SDK-based service that uses the same ratio.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("specroute.tracing")

_TRACE_ID_LIMIT = (1 << 64) - 1
_ROOT_RATIO = {"always_on": 1.0, "always_off": 0.0, "parentbased_always_on": 1.0, "parentbased_always_off": 0.0}


class Sampler:
    __slots__ = ("name", "parent_based", "bound")

    def __init__(self, name: str, parent_based: bool, ratio: float) -> None:
        self.name = name
        self.parent_based = parent_based
        self.bound = round(min(1.0, max(0.0, ratio)) * (_TRACE_ID_LIMIT + 1))

    def sampled(self, trace_id: int, parent_sampled: bool | None) -> bool:
        """`parent_sampled` is the incoming traceparent's flag, None for a new trace."""
        if self.parent_based and parent_sampled is not None:
            return parent_sampled
        return trace_id & _TRACE_ID_LIMIT < self.bound

    @property
    def samples_every_root(self) -> bool:
        """A new trace (no parent) is always sampled: the caller may skip `sampled`."""
        return self.bound > _TRACE_ID_LIMIT


def sampler_from(sample_ratio: float | None) -> Sampler:
    """OTEL_TRACES_SAMPLER wins; else the config's ratio (parent-based); else always on, parent-based."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        if sample_ratio is not None:
            return Sampler("parentbased_traceidratio", True, sample_ratio)
        name = "parentbased_always_on"
    if name in ("traceidratio", "parentbased_traceidratio"):
        try:
            ratio = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", ""))
        except ValueError:
            log.warning("could not convert OTEL_TRACES_SAMPLER_ARG to a float; using ratio 1.0")
            ratio = 1.0
        return Sampler(name, name.startswith("parentbased"), ratio)
    if name not in _ROOT_RATIO:
        log.warning("unknown OTEL_TRACES_SAMPLER %r; using parentbased_always_on", name)
        name = "parentbased_always_on"
    return Sampler(name, name.startswith("parentbased"), _ROOT_RATIO[name])
