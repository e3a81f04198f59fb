"""Where each number of a twin profile comes from, and which numbers decide the order of strategies.

Every numeric parameter a profile file sets has a `[provenance]` entry, a string that starts with
its kind:

- `source:` a public figure or fact: a paper's table, a model card, an SGLang source path, a
  measurement published in an issue or pull-request thread (the text names it);
- `study:` one of the project's own throughput studies R1..R8 (docs/studies.md);
- `derived:` arithmetic from sourced figures, the arithmetic stated;
- `assumption:` no public figure;
- `design:` a value chosen by construction, not a claim about hardware (the zero-cost profile);
- `measured:` measured on a live server by `specroute profile`: the server, the date and the points
  the value was fitted on (tools/fit/schema.py writes them; counted with the sourced ones).

Any entry may end with `| measure: <experiment>`, the experiment that would measure the number.
An *order-deciding* parameter (one that changes which strategy is fastest for a request:
acceptance, its temperature and context laws, the verify and draft costs, the tree's gain and
costs, the caps and the KV pool) marked `assumption` must name that experiment, or the profile
does not load. `report` counts the kinds per profile (`specroute sim --list --provenance`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import msgspec

__all__ = [
    "Kind",
    "Provenance",
    "ProvenanceCount",
    "ProvenanceError",
    "count",
    "is_order_deciding",
    "parse",
    "table",
]

MEASURE = "| measure:"


class ProvenanceError(ValueError):
    """A provenance entry that does not parse, or an order-deciding assumption without its experiment."""


class Kind(str, enum.Enum):  # noqa: UP042  (values print as the words of the files)
    SOURCE = "source"
    STUDY = "study"
    DERIVED = "derived"
    ASSUMPTION = "assumption"
    DESIGN = "design"
    MEASURED = "measured"


class Provenance(msgspec.Struct, frozen=True):
    kind: Kind
    text: str
    measure: str | None = None  # the experiment that would measure the number


# Dotted names (or their prefix before the first dot, with "*") that decide which strategy is
# fastest for a request. Workload shape (reasoning and answer lengths), identity and prefill
# (the same for every strategy of one model) are not among them.
_ORDER_DECIDING = (
    "acceptance.*",
    "temperature.*",
    "ngram.*",
    "step.t0_ms",
    "step.k_ms",
    "step.knee_tokens",
    "step.k_compute_ms",
    "step.kv_ns_per_token",
    "step.draft_ms",
    "step.draft_ms_per_seq",
    "step.tree_ms_per_node",
    "step.tree_step_ms",
    "speculative.*",
    "max_running_requests",
    "max_total_num_tokens",
)


# Per-prompt spread is a variance around each acceptance level, not a level: it does not move one
# strategy's mean past another's.
_NOT_ORDER_DECIDING = ("acceptance.prompt_spread",)


def is_order_deciding(name: str) -> bool:
    if name in _NOT_ORDER_DECIDING:
        return False
    for pattern in _ORDER_DECIDING:
        if pattern.endswith(".*") and name.startswith(pattern[:-1]):
            return True
        if name == pattern:
            return True
    return False


def parse(name: str, text: str) -> Provenance:
    """The entry of parameter `name`; ProvenanceError naming the parameter if it does not parse."""
    kind_text, sep, rest = text.partition(":")
    try:
        kind = Kind(kind_text.strip())
    except ValueError:
        kinds = ", ".join(k.value for k in Kind)
        raise ProvenanceError(f"provenance of {name}: expected '<kind>: ...' with kind one of {kinds}") from None
    body, _, measure = rest.partition(MEASURE)
    if not sep or not body.strip():
        raise ProvenanceError(f"provenance of {name}: {kind.value} without a text")
    experiment = measure.strip() or None
    if kind is Kind.ASSUMPTION and experiment is None and is_order_deciding(name):
        raise ProvenanceError(
            f"provenance of {name}: an order-deciding assumption must name the experiment that would "
            f"measure it ('... {MEASURE} <experiment>')"
        )
    return Provenance(kind, body.strip(), experiment)


class ProvenanceCount(msgspec.Struct, frozen=True, kw_only=True):
    """The kinds of one profile's entries, all parameters and the order-deciding ones."""

    profile: str
    total: int
    sourced: int  # source + study + measured
    derived: int
    assumed: int
    design: int
    order_deciding: int
    order_deciding_assumed: int
    with_experiment: int  # entries that name the experiment that would measure them
    open_order_deciding: tuple[str, ...]  # order-deciding assumptions (each names its experiment)


def count(profile: str, entries: Mapping[str, Provenance]) -> ProvenanceCount:
    kinds = [p.kind for p in entries.values()]
    deciding = {n: p for n, p in entries.items() if is_order_deciding(n)}
    open_names = tuple(sorted(n for n, p in deciding.items() if p.kind is Kind.ASSUMPTION))
    return ProvenanceCount(
        profile=profile,
        total=len(kinds),
        sourced=sum(k in (Kind.SOURCE, Kind.STUDY, Kind.MEASURED) for k in kinds),
        derived=kinds.count(Kind.DERIVED),
        assumed=kinds.count(Kind.ASSUMPTION),
        design=kinds.count(Kind.DESIGN),
        order_deciding=len(deciding),
        order_deciding_assumed=len(open_names),
        with_experiment=sum(p.measure is not None for p in entries.values()),
        open_order_deciding=open_names,
    )


def table(counts: Iterable[ProvenanceCount]) -> str:
    """A markdown table of the counts (docs/twin.md carries it; a test keeps it current)."""
    lines = [
        "| profile | parameters | sourced | derived | assumed | by design | order-deciding | of them assumed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in counts:
        lines.append(
            f"| {c.profile} | {c.total} | {c.sourced} | {c.derived} | {c.assumed} | {c.design} | "
            f"{c.order_deciding} | {c.order_deciding_assumed} |"
        )
    return "\n".join(lines)
