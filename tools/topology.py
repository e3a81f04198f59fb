"""The embedded default: the seed systems as twin backends (`specroute serve --twins`, the demo).

Each twin runs as its real server would: the K2.6 ones with SGLang's `kimi_k2` reasoning and
tool-call parsers, as the launch recipes start K2.6 (tools/launch/recipes/k26-*.toml), so a
client streaming from the gateway gets `reasoning_content` first, then `content`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from gateway.config import BackendEntry, Config, GatewaySection, parse_listen
from gateway.serve import run_config
from tools.processes import ProcessGroup, free_port, specroute_cmd

__all__ = ["SEED_SYSTEMS", "SeedSystem", "embedded_config", "serve_twins", "start_twins"]

# The server flags of a K2.6 deployment that change what a client sees (launch recipes k26-*).
K26_PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")


class SeedSystem(NamedTuple):
    name: str  # backend name in the gateway (and the twin profile it runs)
    model: str  # served model clients ask for
    strategy: str
    flags: tuple[str, ...] = ()  # the twin's server flags beyond its profile


SEED_SYSTEMS: tuple[SeedSystem, ...] = (
    SeedSystem("k26-ar", "kimi-k2.6", "ar", K26_PARSERS),
    SeedSystem("k26-eagle3", "kimi-k2.6", "eagle3", K26_PARSERS),
    SeedSystem("k26-dflash", "kimi-k2.6", "dflash", K26_PARSERS),
    SeedSystem("qwen36-ddtree-b15", "qwen3.6-27b", "ddtree"),
)


def start_twins(
    group: ProcessGroup, twins: Mapping[str, Sequence[str]], *, time_scale: float | None = None
) -> dict[str, int]:
    """Start one twin per profile (profile -> its extra flags) on a free port; wait until all
    answer /ready. Returns profile -> port."""
    ports = {p: free_port() for p in twins}
    for profile, port in ports.items():
        cmd = specroute_cmd("sim", "--profile", profile, "--port", str(port), *twins[profile])
        if time_scale is not None:
            cmd += ["--time-scale", str(time_scale)]
        group.start(profile, cmd)
    group.wait_ready({p: f"http://127.0.0.1:{port}/ready" for p, port in ports.items()})
    return ports


def embedded_config(ports: dict[str, int], listen: str) -> Config:
    """Config routing to twin backends already listening on `ports` (backend name -> port)."""
    return Config(
        gateway=GatewaySection(listen=listen),
        backends=[
            BackendEntry(name=s.name, url=f"http://127.0.0.1:{ports[s.name]}", model=s.model, strategy=s.strategy)
            for s in SEED_SYSTEMS
        ],
    )


def serve_twins(listen: str | None, time_scale: float | None = None) -> int:
    """`specroute serve --twins`: one twin per seed system, the gateway over them; the twins stop
    when the gateway does."""
    if listen:
        parse_listen(listen, "--listen")  # before anything starts; the error names the flag
    with ProcessGroup() as twins:
        ports = start_twins(twins, {s.name: s.flags for s in SEED_SYSTEMS}, time_scale=time_scale)
        for s in SEED_SYSTEMS:
            print(f"twin {s.name:<20} {s.model:<12} {s.strategy:<7} http://127.0.0.1:{ports[s.name]}", file=sys.stderr)
        return run_config(embedded_config(ports, listen or "127.0.0.1:8000"))
