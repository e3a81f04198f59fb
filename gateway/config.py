"""Gateway configuration: TOML parsed into msgspec Structs, validated at the boundary.

A bad file raises `ConfigError` whose message names the key and what was expected; the CLI
prints it as one line and exits non-zero (no traceback).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

from backends import BackendSpec, Strategy
from policies import POLICY_NAMES as KNOWN_POLICIES
from policies.registry import POLICY_OPTIONS, make_policy


class ConfigError(Exception):
    """A configuration problem, phrased for the operator."""


class GatewaySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    listen: str = "127.0.0.1:8000"
    policy: str = "goodput"
    objective: str = "latency"  # goodput: latency (fastest for this request) | throughput (pool total)
    # Let clients choose a policy per request with the `x-specroute-policy` header.
    allow_policy_header: bool = False
    # SIGTERM: stop accepting, let streams finish for up to this long.
    shutdown_grace_s: float = 30.0
    # Request bodies above this size are refused with 413 before they are parsed. SGLang sets no
    # limit and SGLang's router 512 MB; what makes a K2.6 body large is base64 images in an agent's
    # history (a few MB a screenshot), while 256k tokens of text are about 1-2 MB of JSON.
    max_body_bytes: int = 32 * 1024 * 1024
    # aiohttp connection pool size per backend (keep-alive connections).
    upstream_connections: int = 512
    # Origins a browser may call the gateway from (CORS); empty: no CORS headers at all.
    # ["*"] is what SGLang's own server allows (entrypoints/http_server.py). Read at start only.
    cors_allow_origins: list[str] = msgspec.field(default_factory=list)


class TimeoutsSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    connect_s: float = 5.0
    # Streams: from sending the request to its first generated token. SGLang sends no header before
    # that token, so this covers its queue and the prompt's prefill: a 256k-token prompt takes about
    # 72 s of prefill on the studies' 8-GPU PCIe machine (the twin's derived K2.6 prefill cost), and
    # it may queue behind others as long. Until then nothing reached the client: a timeout is retried.
    first_byte_s: float = 300.0
    # Streams, after the first token: the longest silence between two upstream reads before the
    # stream is cut with an error event.
    idle_stream_s: float = 60.0
    # Non-streaming requests: the whole upstream response.
    request_s: float = 900.0


class RetrySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Retries happen only before the first byte reaches the client, on another backend when possible."""

    attempts: int = 3
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 1.0
    deadline_s: float = 15.0


class HealthSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    interval_s: float = 1.0  # /ready and /v1/loads polling period per backend
    unhealthy_after: int = 2  # consecutive failed readiness checks -> out of the pool
    healthy_after: int = 1  # consecutive good checks -> back in
    circuit_failures: int = 3  # consecutive failed requests -> circuit open
    circuit_cooldown_s: float = 5.0  # open -> half-open (one probe request) after this
    # SGLang's /health_generate this often (0: never): the only check that notices a hung engine,
    # since /ready stays 200 until such a check has failed. It costs a 1-token request on an idle
    # server and nothing on a busy one; SGLang answers 503 after 20 s without a finished batch.
    engine_check_s: float = 10.0
    engine_check_timeout_s: float = 30.0  # no answer at all within this: failed too
    # /v1/models this often: the LoRA adapters each server has loaded, which SGLang's
    # /load_lora_adapter and /unload_lora_adapter change at runtime (0: at start and restarts only).
    models_refresh_s: float = 10.0


PriorityOrder = Literal["high_first", "low_first", "fifo"]


class AdmissionSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_inflight: int = 4096  # gateway-wide requests in flight
    # Per backend; 0 = the backend's own max_running_requests from /server_info (unlimited until known).
    backend_max_inflight: int = 0
    max_queue: int = 1024  # requests waiting for capacity; beyond it 429 at once
    queue_timeout_s: float = 30.0  # a waiting request gets 429 after this
    # The queue's order by the request's `priority` (SGLang's field, passed upstream untouched):
    # high_first as SGLang's --enable-priority-scheduling, low_first as its
    # --schedule-low-priority-values-first, fifo to ignore it.
    priority_order: PriorityOrder = "high_first"
    default_priority: int = 0  # a request without `priority` (SGLang's --default-priority-value)


class AuthSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    api_keys: list[str] = msgspec.field(default_factory=list)
    api_keys_env: str = "SPECROUTE_API_KEYS"  # comma-separated, added to api_keys
    admin_key: str | None = None
    admin_key_env: str = "SPECROUTE_ADMIN_KEY"
    # Routes that answer without a key even when keys are configured.
    public_paths: list[str] = msgspec.field(default_factory=lambda: ["/health", "/ready", "/metrics"])
    rate_limit_rps: float = 0.0  # per API key; 0 = off
    rate_limit_burst: int = 0  # bucket size; 0 = max(1, rps)


class ModelSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per served model overrides, e.g. `[models."kimi-k2.6"] policy = "pinned"`."""

    policy: str | None = None
    pinned_backend: str | None = None
    objective: str | None = None  # goodput
    threshold: int | None = None  # threshold: speculative backends below this many in flight
    epsilon: float | None = None  # goodput exploration probability
    hysteresis: float | None = None  # goodput: margin a challenger needs over the incumbent
    externality: float | None = None  # goodput: weight of the time a request imposes on others (0 = selfish)
    prefix_tracking: bool | None = None  # goodput: prefix-cache affinity (default on)
    ttft_slo_s: float | None = None  # goodput: the TTFT past which each predicted second costs slo_weight more (5)
    slo_weight: float | None = None  # goodput: that weight (1; 0: no SLO term; higher: less tail, less mean speed)
    seed: int | None = None


class BackendEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    url: str
    model: str
    strategy: str = "ar"
    served_name: str | None = None
    api_key: str | None = None


class TracingSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenTelemetry traces. The standard OTEL_* environment variables override these values."""

    exporter: str = "none"  # none | otlp | console  (env OTEL_TRACES_EXPORTER)
    endpoint: str | None = None  # OTLP base URL, e.g. http://jaeger:4318 (env OTEL_EXPORTER_OTLP_ENDPOINT)
    protocol: str = "http/protobuf"  # or grpc with the [grpc] extra (env OTEL_EXPORTER_OTLP_PROTOCOL)
    service_name: str = "specroute"  # env OTEL_SERVICE_NAME
    sample_ratio: float | None = None  # parent-based ratio sampler; env OTEL_TRACES_SAMPLER wins


class LoggingSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    access_log: bool = True  # one JSON line per request on stderr
    include_prompts: bool = False  # prompt text in the access log (off: may be sensitive)
    level: str = "WARNING"


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gateway: GatewaySection = msgspec.field(default_factory=GatewaySection)
    timeouts: TimeoutsSection = msgspec.field(default_factory=TimeoutsSection)
    retry: RetrySection = msgspec.field(default_factory=RetrySection)
    health: HealthSection = msgspec.field(default_factory=HealthSection)
    admission: AdmissionSection = msgspec.field(default_factory=AdmissionSection)
    auth: AuthSection = msgspec.field(default_factory=AuthSection)
    tracing: TracingSection = msgspec.field(default_factory=TracingSection)
    logging: LoggingSection = msgspec.field(default_factory=LoggingSection)
    backends: list[BackendEntry] = msgspec.field(default_factory=list)
    models: dict[str, ModelSection] = msgspec.field(default_factory=dict)

    def backend_specs(self) -> list[BackendSpec]:
        return [
            BackendSpec(
                name=b.name,
                url=b.url.rstrip("/"),
                model=b.model,
                strategy=Strategy(b.strategy),
                served_name=b.served_name,
                api_key=b.api_key,
            )
            for b in self.backends
        ]

    def policy_for(self, model: str) -> str:
        section = self.models.get(model)
        return (section.policy if section and section.policy else None) or self.gateway.policy

    def policy_options(self, model: str, policy: str) -> dict[str, Any]:
        """Options for `make_policy`: only those the named policy takes, model section over gateway."""
        section = self.models.get(model) or ModelSection()
        options: dict[str, Any] = {
            "pinned_backend": section.pinned_backend,
            "threshold": section.threshold,
            "epsilon": section.epsilon,
            "hysteresis": section.hysteresis,
            "externality": section.externality,
            "prefix_tracking": section.prefix_tracking,
            "ttft_slo_s": section.ttft_slo_s,
            "slo_weight": section.slo_weight,
            "seed": section.seed,
            "objective": section.objective or self.gateway.objective,
        }
        return {k: v for k, v in options.items() if v is not None and k in POLICY_OPTIONS.get(policy, ())}


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
    _check_positive(config, source)
    if config.tracing.exporter not in ("none", "otlp", "console"):
        raise ConfigError(
            f"{source}: tracing.exporter: expected one of ['none', 'otlp', 'console'], got {config.tracing.exporter!r}"
        )
    if config.tracing.protocol not in ("http/protobuf", "grpc"):
        raise ConfigError(
            f"{source}: tracing.protocol: expected 'http/protobuf' or 'grpc', got {config.tracing.protocol!r}"
        )
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
    for model in models:  # build each policy once: its own checks (objective, options) name the key
        policy = config.policy_for(model)
        key = f"models.{model}" if model in config.models else "gateway"
        try:
            make_policy(policy, **config.policy_options(model, policy))
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{source}: {key}: policy {policy!r}: {e}") from None


def _check_positive(config: Config, source: str) -> None:
    checks = {
        "gateway.max_body_bytes": config.gateway.max_body_bytes,
        "gateway.upstream_connections": config.gateway.upstream_connections,
        "timeouts.connect_s": config.timeouts.connect_s,
        "timeouts.first_byte_s": config.timeouts.first_byte_s,
        "timeouts.idle_stream_s": config.timeouts.idle_stream_s,
        "timeouts.request_s": config.timeouts.request_s,
        "retry.attempts": config.retry.attempts,
        "health.interval_s": config.health.interval_s,
        "health.unhealthy_after": config.health.unhealthy_after,
        "health.healthy_after": config.health.healthy_after,
        "health.circuit_failures": config.health.circuit_failures,
        "health.engine_check_timeout_s": config.health.engine_check_timeout_s,
        "admission.max_inflight": config.admission.max_inflight,
    }
    for key, value in checks.items():
        if value <= 0:
            raise ConfigError(f"{source}: {key}: expected a value > 0, got {value}")
    for key, value in {
        "admission.max_queue": config.admission.max_queue,
        "health.engine_check_s": config.health.engine_check_s,
        "health.models_refresh_s": config.health.models_refresh_s,
        "admission.backend_max_inflight": config.admission.backend_max_inflight,
        "auth.rate_limit_rps": config.auth.rate_limit_rps,
    }.items():
        if value < 0:
            raise ConfigError(f"{source}: {key}: expected a value >= 0, got {value}")
