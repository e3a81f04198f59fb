"""`specroute config init --from-urls`: gateway backends for running SGLang servers of any model.

Each server is read (`discover`), its `speculative_algorithm` classified (`algorithms`), and the
servers grouped by the model they serve: the gateway routes a request among the backends of the
model it names. A backend is named after its model and strategy (`kimi-k2.6-dflash`, a second one
`kimi-k2.6-dflash-2`). The comment above each says what the server reported and what the gateway
will miss for lack of a flag; a server that could not be read or classified is written commented
out, with the reason.
"""

from __future__ import annotations

import asyncio
import re

from tools.cli_config import Backend
from tools.fit.discover import ServerFacts, discover_all

__all__ = ["backend_notes", "backends_from_facts", "backends_from_urls"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _slug(model: str) -> str:
    """A backend name's model part: the last path segment of the served name, without '@' or '/'."""
    return _UNSAFE.sub("-", model.rstrip("/").rsplit("/", 1)[-1]).strip("-") or "model"


def _version_before(version: str | None, major: int, minor: int, patch: int) -> bool:
    nums = [int(x) for x in re.findall(r"\d+", version or "")[:3]]
    return len(nums) == 3 and tuple(nums) < (major, minor, patch)


def backend_notes(f: ServerFacts) -> list[str]:
    """What the comment above a server's entry says: what it reported, what the gateway will miss."""
    c = f.classification
    algo = c.reported if c is not None and c.reported else "no speculative decoding"
    strategy = f"-> {c.strategy}" if c is not None and c.strategy else ""
    why = f" ({c.why})" if c is not None and c.reported else ""
    ctx = f"{f.context_length:,}" if f.context_length else "?"
    notes = [
        f"{f.url}: SGLang {f.version or '?'}, {f.served_model_name}, {algo} {strategy}{why}; cap "
        f"{f.max_running_requests or '?'}, context {ctx} tokens"
    ]
    if f.sim_profile:
        notes.append(f"a twin: `specroute sim --profile {f.sim_profile}`")
    if not f.enable_metrics:
        notes.append(
            "started without --enable-metrics: no windowed acceptance gauge, the gateway derives it from the "
            "lifetime average"
        )
    if not f.enable_cache_report:
        notes.append("started without --enable-cache-report: the gateway cannot see prefix-cache hits in usage")
    if f.load_path != "/v1/loads":
        notes.append("no /v1/loads (SGLang before 0.5.23): the load comes from /get_load, no step-time counters")
    if c is not None and c.reported is not None and _version_before(f.version, 0, 5, 23):
        notes.append(
            "no per-request speculation details before SGLang 0.5.23 (`return_spec_tokens_details`): acceptance is "
            "learned from /metrics or the server's lifetime average"
        )
    return notes


def _strategy(f: ServerFacts) -> str | None:
    return f.classification.strategy if f.classification is not None else None


def backends_from_facts(facts: list[ServerFacts]) -> list[Backend]:
    """One entry per server, grouped by served model (in order of first appearance), then strategy."""
    order: dict[str, int] = {}
    for f in facts:
        order.setdefault(f.served_model_name or "", len(order))
    ranked = sorted(
        range(len(facts)),
        key=lambda i: (order[facts[i].served_model_name or ""], _strategy(facts[i]) or "~", i),
    )
    taken: dict[str, int] = {}
    out: list[Backend] = []
    for i in ranked:
        f = facts[i]
        c = f.classification
        model = f.served_model_name or ""
        strategy = _strategy(f) or "?"
        base = f"{_slug(model)}-{strategy}" if model and f.error is None else f"unread-{_slug(f.url.split('//')[-1])}"
        taken[base] = taken.get(base, 0) + 1
        name = base if taken[base] == 1 else f"{base}-{taken[base]}"
        disabled = None
        if f.error:
            disabled = f"{f.url}: {f.error}"
        elif not model:
            disabled = f"{f.url}: the server reports no served model name"
        elif c is not None and c.strategy is None:
            disabled = f"{f.url}: speculative_algorithm {c.reported}: {c.why}"
        notes = backend_notes(f) if f.error is None else []
        out.append(Backend(name, "", f.url, model or "?", strategy, "server", notes=notes, disabled=disabled))
    return out


def backends_from_urls(urls: list[str], *, api_key: str | None = None) -> list[Backend]:
    from gateway.config import url_problem
    from tools.cli_usage import UsageError

    if not urls:
        raise UsageError("--from-urls: no URL given")
    for u in urls:
        problem = url_problem(u)
        if problem:
            raise UsageError(f"--from-urls: {problem}")
    return backends_from_facts(asyncio.run(discover_all(urls, api_key=api_key)))
