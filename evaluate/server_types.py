"""Server types from profile files: what `specroute plan --profiles` and `specroute eval --profiles` plan over.

A user's own servers come as twin profiles fitted from them (`specroute profile`), one file each,
usually all in one directory. Each file is a server type (a fleet member by its path, so fleets
that name it parse again anywhere). All must serve one model: a fleet serves one model. A named
traffic's open-loop loads are fractions of N servers of a reference profile; the built-in
reference (k26-dflash) is another model's server, so with profiles of another model the reference
becomes one of them: the one given, else the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from evaluate.fleet import FleetError, parse_member
from evaluate.scenarios import Scenario
from twin.profile import ProfileError, load_profile

__all__ = ["profile_types", "served_model", "with_reference"]


def profile_types(spec: str) -> list[str]:
    """`DIR` (every *.toml in it, sorted) or comma-separated profile files and bundled names."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        path = Path(part).expanduser()
        if path.is_dir():
            found = sorted(str(p) for p in path.glob("*.toml") if not p.name.startswith("."))
            if not found:
                raise FleetError(f"--profiles {part}: no .toml profile in the directory")
            out += found
        elif part.endswith(".toml") and not path.is_file():
            raise FleetError(f"--profiles {part}: no such file")
        else:
            out.append(str(path) if part.endswith(".toml") else part)
    if not out:
        raise FleetError("--profiles: no profile given")
    for t in out:
        parse_member(t)  # each loads, with a message naming it
    return list(dict.fromkeys(out))


def served_model(types: Sequence[str]) -> str:
    """The one model the types serve; FleetError naming them when they serve several."""
    models: dict[str, list[str]] = {}
    for t in types:
        try:
            model = load_profile(parse_member(t).profile).served_model_name
        except ProfileError as e:
            raise FleetError(f"server type {t!r}: {e}") from None
        models.setdefault(model, []).append(t)
    if len(models) > 1:
        which = "; ".join(f"{m}: {', '.join(ts)}" for m, ts in models.items())
        raise FleetError(f"the server types serve more than one model ({which}): plan one model at a time")
    return next(iter(models))


def with_reference(scenario: Scenario, types: Sequence[str], reference: str | None) -> Scenario:
    """The scenario with its reference among `types` when it serves another model than they do
    (or `reference` if given)."""
    if reference is not None:
        parse_member(reference)
        return msgspec.structs.replace(scenario, reference=reference)
    model = served_model(types)
    try:
        current = load_profile(parse_member(scenario.reference).profile).served_model_name
    except (ProfileError, FleetError):
        current = None
    if current == model:
        return scenario
    return msgspec.structs.replace(scenario, reference=types[0])
