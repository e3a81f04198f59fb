"""Gateway configuration: TOML parsed into msgspec Structs, validated at the boundary.

A bad file raises `ConfigError` whose message names the key and what was expected; the CLI
prints it as one line and exits non-zero (no traceback).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from backends import BackendSpec, Strategy

from policies import POLICY_NAMES as KNOWN_POLICIES


class ConfigError(Exception):
    """A configuration problem, phrased for the operator."""


class GatewaySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    listen: str = "127.0.0.1:8000"
    policy: str = "least_inflight"
    # Request bodies above this size are refused with 413 before they are parsed.
    max_body_bytes: int = 4 * 1024 * 1024
    # aiohttp connection pool size per backend (keep-alive connections).
    upstream_connections: int = 512
    connect_timeout_s: float = 5.0
    # Background polling of /ready and /v1/loads per backend.
    poll_interval_s: float = 1.0


class ModelSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per served model overrides, e.g. `[models."kimi-k2.6"] policy = "pinned"`."""

    policy: str | None = None
    pinned_backend: str | None = None


class BackendEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    url: str
    model: str
    strategy: str = "ar"
    served_name: str | None = None
    api_key: str | None = None


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gateway: GatewaySection = msgspec.field(default_factory=GatewaySection)
    backends: list[BackendEntry] = msgspec.field(default_factory=list)
    models: dict[str, ModelSection] = msgspec.field(default_factory=dict)

    def backend_specs(self) -> list[BackendSpec]:
        return [
            BackendSpec(name=b.name, url=b.url.rstrip("/"), model=b.model, strategy=Strategy(b.strategy),
                        served_name=b.served_name, api_key=b.api_key)
            for b in self.backends
        ]

    def policy_for(self, model: str) -> str:
        section = self.models.get(model)
        return (section.policy if section and section.policy else None) or self.gateway.policy


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"gateway.listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    try:
        config = msgspec.convert(data, Config)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {_humanize(str(e))}") from None
    _check(config, source)
    return config


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file ({e.strerror})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return config_from_dict(data, str(path))


def _humanize(message: str) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.gateway.listen`"; lead with the key.
    text, sep, where = message.partition(" - at `")
    text = text.replace("Object contains unknown field", "unknown key")
    if sep:
        key = where.rstrip("`").removeprefix("$.").removeprefix("$")
        return f"{key or '(top level)'}: {text}"
    return text


def _check(config: Config, source: str) -> None:
    parse_listen(config.gateway.listen)
    strategies = {s.value for s in Strategy}
    seen: set[str] = set()
    for i, b in enumerate(config.backends):
        where = f"{source}: backends[{i}]"
        if b.name in seen:
            raise ConfigError(f"{where}.name: duplicate backend name {b.name!r}")
        seen.add(b.name)
        if "@" in b.name or not b.name:
            raise ConfigError(f"{where}.name: expected a non-empty name without '@', got {b.name!r}")
        if not b.url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.url: expected an http:// or https:// URL, got {b.url!r}")
        if b.strategy not in strategies:
            raise ConfigError(f"{where}.strategy: expected one of {sorted(strategies)}, got {b.strategy!r}")
    policies = [("gateway.policy", config.gateway.policy)]
    policies += [(f"models.{m}.policy", s.policy) for m, s in config.models.items() if s.policy]
    for key, name in policies:
        if name not in KNOWN_POLICIES:
            raise ConfigError(f"{source}: {key}: unknown policy {name!r}, expected one of {list(KNOWN_POLICIES)}")
    models = {b.model for b in config.backends}
    for model, section in config.models.items():
        if model not in models:
            raise ConfigError(f"{source}: models.{model}: no backend serves model {model!r}")
        if section.pinned_backend and section.pinned_backend not in seen:
            raise ConfigError(f"{source}: models.{model}.pinned_backend: unknown backend {section.pinned_backend!r}")
