"""Fleets: which twin servers a run puts behind the router, written as one string.

    FLEET   := MEMBER ("," MEMBER)*
    MEMBER  := [COUNT "x"] PROFILE (":" OPTION)*     PROFILE: a bundled name or a profile file (.toml)
    OPTION  := "b=" INT      DDTree node budget (DDTree profiles only; verify width budget + 1)
             | "t=" FLOAT    step-time scale: every step and prefill takes t x the profile's time
             | "a=" FLOAT    acceptance scale: every draft's acceptance probability x a

e.g. `2xk26-ddtree:b=16,2xk26-dflash`, or `k26-dflash:t=1.3:a=0.85` for a server whose physics
are off the studies' figures (slower hardware, a weaker drafter): the evaluation's check that a
policy has no home advantage, since its priors are the studies' figures.

Backends are named after their member, numbered when a member counts more than one server or
appears twice (`k26-dflash-1`, `k26-dflash-2`). Every error names the member at fault.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from twin.profile import Profile, ProfileError, load_profile, profile_names

__all__ = ["FleetError", "Member", "Server", "fleet_label", "parse_fleet", "servers"]

MAX_SERVERS = 64  # a fleet beyond this is a typo, not a plan (and the search would not finish)
_MEMBER = re.compile(r"^(?:(\d+)x)?([A-Za-z0-9./~][A-Za-z0-9._/~-]*)((?::[^:,]*)*)$")


class FleetError(ValueError):
    """A fleet string that does not parse or names something unknown; the message says which part."""


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """`count` identical servers of one profile variant."""

    profile: str
    count: int = 1
    budget: int | None = None
    time_scale: float = 1.0
    accept_scale: float = 1.0

    @property
    def label(self) -> str:
        """The member without its count: `k26-ddtree:b=16`."""
        opts = []
        if self.budget is not None:
            opts.append(f"b={self.budget}")
        if self.time_scale != 1.0:
            opts.append(f"t={self.time_scale:g}")
        if self.accept_scale != 1.0:
            opts.append(f"a={self.accept_scale:g}")
        return ":".join([self.profile, *opts])

    def build_profile(self) -> Profile:
        """The profile with this member's budget and time scale applied (acceptance scale is the
        engine's `accept_scale` knob, applied by the simulator)."""
        p = load_profile(self.profile)
        if self.budget is not None:
            p = p.with_budget(self.budget)
        if self.time_scale != 1.0:
            p = scaled_time(p, self.time_scale)
        return p


class Server(msgspec.Struct, frozen=True, kw_only=True):
    """One backend of a fleet: its name, the member it comes from."""

    name: str
    member: Member


def scaled_time(profile: Profile, factor: float) -> Profile:
    """Every time figure of the step model (ms and ns costs; not the knee, a token count) times
    `factor`: a slower or faster machine."""
    st = profile.step
    scaled = {
        k: v * factor for k, v in msgspec.structs.asdict(st).items() if isinstance(v, float) and k != "knee_tokens"
    }
    return msgspec.structs.replace(profile, step=msgspec.structs.replace(st, **scaled))


def _option(member: str, text: str, opts: dict[str, float | int]) -> None:
    key, sep, value = text.partition("=")
    if not sep or key not in ("b", "t", "a"):
        raise FleetError(f"fleet member {member!r}: unknown option {text!r} (expected b=INT, t=FLOAT or a=FLOAT)")
    if key in opts:
        raise FleetError(f"fleet member {member!r}: option {key}= given twice")
    try:
        number: float | int = int(value) if key == "b" else float(value)
    except ValueError:
        raise FleetError(f"fleet member {member!r}: {key}= needs a number, got {value!r}") from None
    if key == "b" and not 1 <= number <= 512:
        raise FleetError(f"fleet member {member!r}: DDTree budget b={value} must be in [1, 512]")
    if key != "b" and not 0.05 <= number <= 20:  # also refuses nan and inf
        raise FleetError(f"fleet member {member!r}: {key}={value} must be within [0.05, 20]")
    opts[key] = number


def parse_member(text: str) -> Member:
    m = _MEMBER.match(text.strip())
    if m is None:
        raise FleetError(f"fleet member {text!r} does not parse (expected [COUNTx]PROFILE[:b=N][:t=F][:a=F])")
    count_s, name, rest = m.groups()
    count = int(count_s) if count_s is not None else 1
    if count < 1:
        raise FleetError(f"fleet member {text!r}: a member needs at least one server, got {count}")
    if name.startswith("~"):
        name = str(Path(name).expanduser())
    if Path(name).is_dir():
        raise FleetError(f"fleet member {text!r}: a directory; give its profiles as server types (--profiles DIR)")
    try:
        profile = load_profile(name)
    except ProfileError as e:
        if Path(name).is_file():  # a profile file that does not load: say why
            raise FleetError(f"fleet member {text!r}: {e}") from None
        raise FleetError(
            f"fleet member {text!r}: unknown profile {name!r} (known: {', '.join(profile_names())}, or a .toml file)"
        ) from None
    opts: dict[str, float | int] = {}
    for part in (p for p in rest.split(":") if p):
        _option(text, part, opts)
    if "b" in opts and (profile.speculative is None or profile.speculative.algorithm != "DDTREE"):
        raise FleetError(f"fleet member {text!r}: b= (a DDTree budget) on {name}, which is not a DDTree profile")
    if "b" in opts and profile.provenance.get("acceptance.math", "").startswith("measured:"):
        raise FleetError(
            f"fleet member {text!r}: b= on a measured profile: its acceptance was measured at budget "
            f"{profile.speculative.ddtree_budget if profile.speculative else '?'} only (profile another server for "
            "another budget)"
        )
    return Member(
        profile=name,
        count=count,
        budget=int(opts["b"]) if "b" in opts else None,
        time_scale=float(opts.get("t", 1.0)),
        accept_scale=float(opts.get("a", 1.0)),
    )


def parse_fleet(text: str) -> tuple[Member, ...]:
    """`2xk26-ddtree:b=16,2xk26-dflash` -> its members; FleetError naming the culprit."""
    if not isinstance(text, str) or not text.strip():
        raise FleetError("empty fleet: give at least one member, e.g. 2xk26-dflash")
    members = tuple(parse_member(part) for part in text.split(","))
    total = sum(m.count for m in members)
    if total > MAX_SERVERS:
        raise FleetError(f"fleet {text!r} has {total} servers; at most {MAX_SERVERS}")
    return members


def servers(members: Sequence[Member]) -> list[Server]:
    """One Server per backend, uniquely named."""
    totals: dict[str, int] = {}
    for m in members:
        totals[m.label] = totals.get(m.label, 0) + m.count
    seen: dict[str, int] = {}
    out = []
    for m in members:
        for _ in range(m.count):
            k = seen.get(m.label, 0) + 1
            seen[m.label] = k
            out.append(Server(name=m.label if totals[m.label] == 1 else f"{m.label}-{k}", member=m))
    return out


def fleet_label(members: Sequence[Member]) -> str:
    """The canonical string of a fleet (counts merged, members sorted): equal fleets print alike."""
    counts: dict[str, tuple[int, Member]] = {}
    for m in members:
        n, _ = counts.get(m.label, (0, m))
        counts[m.label] = (n + m.count, m)
    return ",".join(f"{n}x{label}" if n > 1 else label for label, (n, _) in sorted(counts.items()))
