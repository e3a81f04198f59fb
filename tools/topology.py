"""The embedded default: the four seed systems as twin backends, for demos and tests."""

from __future__ import annotations

from typing import NamedTuple

from gateway.config import BackendEntry, Config, GatewaySection


class SeedSystem(NamedTuple):
    name: str  # backend name in the gateway (and the twin profile it runs)
    model: str  # served model clients ask for
    strategy: str


SEED_SYSTEMS: tuple[SeedSystem, ...] = (
    SeedSystem("k26-ar", "kimi-k2.6", "ar"),
    SeedSystem("k26-eagle3", "kimi-k2.6", "eagle3"),
    SeedSystem("k26-dflash", "kimi-k2.6", "dflash"),
    SeedSystem("qwen36-ddtree-b15", "qwen3.6-27b", "ddtree"),
)


def embedded_config(ports: dict[str, int], listen: str) -> Config:
    """Config routing to twin backends already listening on `ports` (backend name -> port)."""
    return Config(
        gateway=GatewaySection(listen=listen),
        backends=[
            BackendEntry(name=s.name, url=f"http://127.0.0.1:{ports[s.name]}", model=s.model, strategy=s.strategy)
            for s in SEED_SYSTEMS
        ],
    )
