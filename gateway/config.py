"""Gateway configuration: TOML parsed into msgspec Structs, validated at the boundary.

A bad file raises `ConfigError` whose message names the key and what was expected; the CLI
prints it as one line and exits non-zero (no traceback).
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import json
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from backends import BackendSpec, Strategy
from common.priority import priority_in_range
from gateway.extras import GUARDED_EXTRAS, guarded_extra
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
    # The most bytes of request bodies being received and decoded at once, over all requests: a
    # body announced (content-length) beyond what is left waits for room within
    # timeouts.client_body_s, and one sent in chunks that would overrun it is refused (503). A
    # JSON body decodes to several times its size in objects, so this bounds that peak.
    max_body_bytes_in_flight: int = 64 * 1024 * 1024
    # A non-streamed answer (or a stored Response looked up) larger than this is refused (502)
    # rather than held whole in memory. n=128 samples of 32k tokens with top-20 logprobs stay below.
    max_response_bytes: int = 64 * 1024 * 1024
    # Client connections open at once; one more is answered 503 and closed. Each holds a file
    # descriptor: the process's limit (ulimit -n) must be above this plus the upstream pools.
    max_connections: int = 8192
    # aiohttp connection pool size per backend (keep-alive connections).
    upstream_connections: int = 512
    # Lookups of stored Responses this gateway has no record of, running at once (each asks every
    # candidate backend once); more wait their turn up to 2 s, then 503.
    response_lookups: int = 16
    # SGLang request fields clients may send through this gateway although they reach past one
    # request: custom_logit_processor (code the server runs), return_hidden_states, bootstrap_*
    # (disaggregation endpoints), rid (the server's request id), data_parallel_rank. Refused (400)
    # unless named here (gateway/extras.py).
    allowed_extras: list[str] = msgspec.field(default_factory=list)
    # Origins a browser may call the gateway from (CORS); empty: no CORS headers at all.
    # ["*"] is what SGLang's own server allows (entrypoints/http_server.py). Read at start only.
    cors_allow_origins: list[str] = msgspec.field(default_factory=list)
    # How often the config file (`serve --config`) is checked for a change, which is then applied as
    # SIGHUP applies it (gateway/config_watch.py); 0: never, SIGHUP and POST /admin/reload only.
    config_watch_s: float = 1.0


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
    # A client's request body, from its first byte to its last: one that trickles in (slow-loris)
    # would otherwise hold a connection and its buffer as long as it likes. 32 MB at 10 Mbit/s: 27 s.
    client_body_s: float = 60.0
    # A new connection, or a request begun on a kept-alive one, must have sent its headers within this.
    client_header_s: float = 30.0
    # A client that accepts no bytes of its answer for this long is dropped: its connection is
    # closed and its upstream request aborted, so it holds no backend slot (nginx: send_timeout 60s).
    client_send_s: float = 60.0


class RetrySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Retries happen only before the first byte reaches the client, on another backend when possible."""

    attempts: int = 3
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 1.0
    deadline_s: float = 15.0
    # A request in flight on this many backends that failed under it (died, stopped stepping, or
    # dropped its connection) is not retried, and the same body is refused for quarantine_s
    # (gateway/suspects.py); 0: never
    quarantine_after: int = 2
    quarantine_s: float = 600.0
    # Retry budget (Envoy's and Finagle's): retries are at most this share of the requests of the
    # last budget_window_s, plus budget_min_retries_per_s for each of its seconds (Finagle's
    # defaults: 20%, 10 s, 10/s), so that a failing pool is not sent its traffic several times over.
    budget_share: float = 0.2
    budget_window_s: float = 10.0
    budget_min_retries_per_s: float = 10.0


class HealthSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    interval_s: float = 1.0  # /ready and /v1/loads polling period per backend
    unhealthy_after: int = 2  # consecutive failed readiness checks -> out of the pool
    healthy_after: int = 1  # consecutive good checks -> back in
    circuit_failures: int = 3  # consecutive failed requests -> circuit open
    circuit_cooldown_s: float = 5.0  # open -> half-open (one probe request) after this
    # Each time a circuit opens again without a success between, its cooldown doubles, up to this.
    circuit_max_cooldown_s: float = 300.0
    # At most this share of a model's backends may have their circuit open at once (at least one):
    # past it a failing backend stays in (Envoy's max_ejection_percent), and when no backend of a
    # model is left up but for open circuits, requests go to those anyway (Envoy's panic routing).
    max_ejected_share: float = 0.5
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


class ClientEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An API key with settings of its own (`[[auth.clients]]`)."""

    name: str
    key: str | None = None
    key_env: str | None = None  # the key read from this environment variable
    # The `priority` this client may set, [lowest, highest]: its requests' values are clamped into
    # it. Empty: the gateway-wide auth.priority_range.
    priority_range: list[int] = msgspec.field(default_factory=list)


class AuthSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    api_keys: list[str] = msgspec.field(default_factory=list)
    api_keys_env: str = "SPECROUTE_API_KEYS"  # comma-separated, added to api_keys
    admin_key: str | None = None
    admin_key_env: str = "SPECROUTE_ADMIN_KEY"
    # Routes that answer without a key even when keys are configured.
    public_paths: list[str] = msgspec.field(default_factory=lambda: ["/health", "/ready", "/metrics"])
    rate_limit_rps: float = 0.0  # per API key; 0 = off
    rate_limit_burst: int = 0  # bucket size; 0 = max(1, rps)
    # Keys with settings of their own, beside api_keys.
    clients: list[ClientEntry] = msgspec.field(default_factory=list)
    # The `priority` clients may set, [lowest, highest]; a request's value is clamped into it.
    # Empty: none, every request gets admission.default_priority (a client cannot push others out).
    priority_range: list[int] = msgspec.field(default_factory=list)
    # Serve on a non-loopback address with no API key. Off: the gateway refuses to start that way.
    allow_unauthenticated: bool = False


class ModelSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per served model overrides, e.g. `[models."kimi-k2.6"] policy = "pinned"`."""

    policy: str | None = None
    pinned_backend: str | None = None
    objective: str | None = None  # goodput
    threshold: int | None = None  # threshold: speculative backends below this many in flight
    epsilon: float | None = None  # goodput exploration probability
    hysteresis: float | None = None  # goodput: margin a challenger needs over the incumbent
    externality: float | None = None  # goodput: weight of the time a request imposes on others (0 = selfish)
    ttft_weight: float | None = None  # goodput: seconds of TTFT counted as this many seconds of decode (1)
    prefix_tracking: bool | None = None  # goodput: prefix-cache affinity (default on)
    ttft_slo_s: float | None = None  # goodput: the TTFT past which each predicted second costs slo_weight more (5)
    tpot_slo_s: float | None = None  # goodput: the time per output token past which decode costs slo_weight more (0.06)
    slo_weight: float | None = None  # goodput: that weight (1; 0: no SLO term; higher: less tail, less mean speed)
    seed: int | None = None


Discover = Literal["none", "dns"]


class BackendEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    url: str
    model: str
    strategy: str = "ar"
    served_name: str | None = None
    # The upstream's own key (SGLang's --api-key), sent as Authorization: Bearer. Either here in
    # plaintext, or, better, read at load from the environment variable api_key_env names (a
    # Kubernetes Secret mounted as an environment variable: docs/deployment.md). At most one of the two.
    api_key: str | None = None
    api_key_env: str | None = None
    # "dns": the URL's host is a DNS name (a headless Service) whose every address is a backend of its
    # own, named `NAME~ADDRESS`, followed as the name's addresses change (gateway/discovery.py).
    discover: Discover = "none"


class DiscoverySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How `discover = "dns"` backends are resolved."""

    resolve_s: float = 5.0  # each DNS name is resolved again this often (Envoy's dns_refresh_rate: 5 s)
    # DNS servers asked directly ("IP" or "IP:PORT"), the name looked up as written; empty: the
    # system's resolver (getaddrinfo: /etc/hosts, resolv.conf and its search domains, as the pod's).
    nameservers: list[str] = msgspec.field(default_factory=list)
    resolve_timeout_s: float = 5.0  # a lookup with no answer by then failed: the members stay as they were


class MetricsSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """/metrics. Bucket bounds, in seconds, ascending; empty: derived from the timeouts so that every
    latency the gateway allows lands in a finite bucket (gateway/metrics.py). Read at start."""

    ttft_buckets_s: list[float] = msgspec.field(default_factory=list)
    duration_buckets_s: list[float] = msgspec.field(default_factory=list)


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
    discovery: DiscoverySection = msgspec.field(default_factory=DiscoverySection)
    metrics: MetricsSection = msgspec.field(default_factory=MetricsSection)
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
                api_key=backend_api_key(b),
            )
            for b in self.backends
        ]

    def policy_for(self, model: str) -> str:
        section = self.models.get(model)
        return (section.policy if section and section.policy else None) or self.gateway.policy

    def policy_options(self, model: str, policy: str) -> dict[str, Any]:
        """Options for `make_policy`: only those the named policy takes, model section over gateway.

        Loading refuses a model section's option that its policy does not take (`_check_model_options`),
        except, with `gateway.allow_policy_header`, one that a policy a client may choose takes: that
        option is for the policy the header names, and is left out here for the others."""
        section = self.models.get(model) or ModelSection()
        options = _section_options(section)
        options.setdefault("objective", self.gateway.objective)
        return {k: v for k, v in options.items() if k in POLICY_OPTIONS.get(policy, ())}


# ModelSection fields that are policy options (all but `policy`), under the names `make_policy` takes.
MODEL_OPTIONS: tuple[str, ...] = tuple(f for f in ModelSection.__struct_fields__ if f != "policy")
# Policies a client may choose with x-specroute-policy (gateway/proxy.py refuses `pinned` there).
HEADER_POLICIES: tuple[str, ...] = tuple(p for p in KNOWN_POLICIES if p != "pinned")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Between a discovered entry's name and a member's address (`k26-dflash~10.0.0.5`): a character
# configured names may not hold, so a member's name is never another backend's.
MEMBER_SEPARATOR = "~"
MAX_BUCKETS = 64  # histogram bounds of one metrics key


def _section_options(section: ModelSection) -> dict[str, Any]:
    """The options a model section sets (None: not set)."""
    return {k: v for k in MODEL_OPTIONS if (v := getattr(section, k)) is not None}


def backend_api_key(entry: BackendEntry, where: str | None = None) -> str | None:
    """The key a backend entry sends upstream: its `api_key`, or the value of the environment
    variable its `api_key_env` names, without surrounding whitespace (a key file's newline).
    ConfigError when that variable is unset or empty: the upstream would answer every request 401."""
    if entry.api_key_env is None:
        return entry.api_key
    value = os.environ.get(entry.api_key_env, "").strip()
    if not value:
        state = "empty" if entry.api_key_env in os.environ else "not set"
        where = where or f"backend {entry.name!r}"
        raise ConfigError(
            f"{where}.api_key_env: the environment variable {entry.api_key_env} is {state}; "
            "set it to the upstream's --api-key, or remove api_key_env"
        )
    return value


def model_key(model: str) -> str:
    """A served model's section as TOML names it: `models.m`, or `models."kimi-k2.6"` (quoted: not a bare key)."""
    return f"models.{model}" if re.fullmatch(r"[A-Za-z0-9_-]+", model) else f"models.{json.dumps(model)}"


def parse_listen(listen: str, key: str = "gateway.listen") -> tuple[str, int]:
    """(host, port) of a listen address; a ConfigError names `key` (the config key, or `--listen`).

    The port is 1..65535: the gateway announces the address it serves on and probes call it there,
    so port 0 (any free port) is refused too."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not host.strip("[]"):
        raise ConfigError(f"{key}: expected HOST:PORT, got {listen!r}")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected a port in 1..65535, got {listen!r}")
    return host.strip("[]"), int(port)


def url_problem(url: str) -> str | None:
    """What is wrong with an http(s) base URL (a backend's, an OTLP endpoint), or None if nothing.

    It needs the scheme http or https, a host, and a port in 1..65535 if it gives one; it may carry
    a path (a prefix the gateway's paths go after), but no query or fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a broken [IPv6] host
        return f"expected an http:// or https:// URL with a valid host, got {url!r}"
    if parts.scheme not in ("http", "https") or not url.lower().startswith(("http://", "https://")):
        return f"expected an http:// or https:// URL, got {url!r}"
    if not parts.hostname:
        return f"expected a host after {parts.scheme}://, got {url!r}"
    if any(c.isspace() for c in url):
        return f"expected a URL without spaces, got {url!r}"
    try:
        port = parts.port
    except ValueError:  # not a number, or above 65535
        return f"expected a port in 1..65535 after the host, got {url!r}"
    if port == 0:
        return f"expected a port in 1..65535 after the host, got {url!r}"
    if parts.query or parts.fragment or url.rstrip("/").endswith(("?", "#")):
        return f"expected a base URL without a query or fragment, got {url!r}"
    return None


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    try:
        config = msgspec.convert(data, Config)
    except msgspec.ValidationError as e:
        model_error = _model_error(data) if "- at `$.models[...]" in str(e) else None
        raise ConfigError(f"{source}: {model_error or _humanize(str(e))}") from None
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


def _humanize(message: str, prefix: str = "") -> str:
    # msgspec says "Expected `int`, got `str` - at `$.gateway.listen`"; lead with the key.
    text, sep, where = message.partition(" - at `")
    text = text.replace("Object contains unknown field", "unknown key")
    if sep:
        key = where.rstrip("`").removeprefix("$")
        key = prefix + key if prefix else key.removeprefix(".")
        return f"{key or '(top level)'}: {text}"
    return f"{prefix}: {text}" if prefix else text


def _model_error(data: dict[str, Any]) -> str | None:
    """The first bad model section's error, naming the model: msgspec says `models[...]`."""
    models = data.get("models")
    if not isinstance(models, dict):
        return None
    for model, section in models.items():
        try:
            msgspec.convert(section, ModelSection)
        except msgspec.ValidationError as e:
            return _humanize(str(e), model_key(str(model)))
    return None


def _check(config: Config, source: str) -> None:
    try:
        parse_listen(config.gateway.listen)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    _check_ranges(config, source)
    _check_lists(config, source)
    if config.gateway.max_body_bytes > config.gateway.max_body_bytes_in_flight:
        raise ConfigError(
            f"{source}: gateway.max_body_bytes: expected at most gateway.max_body_bytes_in_flight "
            f"({config.gateway.max_body_bytes_in_flight}), got {config.gateway.max_body_bytes}: "
            "such a body could never be read"
        )
    for name in config.gateway.allowed_extras:
        if not guarded_extra(name):
            raise ConfigError(
                f"{source}: gateway.allowed_extras: {name!r} is not one of the fields the gateway refuses "
                f"({', '.join(GUARDED_EXTRAS)}); every other field passes through already"
            )
    _check_auth(config.auth, source)
    if config.logging.level.upper() not in LOG_LEVELS:
        raise ConfigError(f"{source}: logging.level: expected one of {list(LOG_LEVELS)}, got {config.logging.level!r}")
    if config.tracing.exporter not in ("none", "otlp", "console"):
        raise ConfigError(
            f"{source}: tracing.exporter: expected one of ['none', 'otlp', 'console'], got {config.tracing.exporter!r}"
        )
    if config.tracing.protocol not in ("http/protobuf", "grpc"):
        raise ConfigError(
            f"{source}: tracing.protocol: expected 'http/protobuf' or 'grpc', got {config.tracing.protocol!r}"
        )
    if config.tracing.endpoint is not None:
        problem = _endpoint_problem(config.tracing.endpoint, config.tracing.protocol)
        if problem:
            raise ConfigError(f"{source}: tracing.endpoint: {problem}")
    strategies = {s.value for s in Strategy}
    seen: set[str] = set()
    for i, b in enumerate(config.backends):
        where = f"{source}: backends[{i}]"
        if b.name in seen:
            raise ConfigError(f"{where}.name: duplicate backend name {b.name!r}")
        seen.add(b.name)
        if any(c in b.name for c in "@/" + MEMBER_SEPARATOR) or not b.name.strip():
            # '@' separates a model from the backend it names; '/' would break the admin API's paths;
            # '~' names the members of a discovered entry (NAME~ADDRESS)
            raise ConfigError(
                f"{where}.name: expected a non-empty name without '@', '/' or '{MEMBER_SEPARATOR}', got {b.name!r}"
            )
        problem = url_problem(b.url)
        if problem:
            raise ConfigError(f"{where}.url: {problem}")
        if b.discover == "dns" and urlsplit(b.url).scheme != "http":
            raise ConfigError(
                f'{where}.discover: "dns" connects to each address the name resolves to, and an https '
                "server's certificate names its host, not its addresses: use an http:// URL (inside the "
                "cluster), or one entry per server"
            )
        if not b.model.strip():
            raise ConfigError(f"{where}.model: expected the non-empty name of the model it serves, got {b.model!r}")
        if b.strategy not in strategies:
            raise ConfigError(f"{where}.strategy: expected one of {sorted(strategies)}, got {b.strategy!r}")
        _check_backend_key(b, where)
    policies = [("gateway.policy", config.gateway.policy)]
    policies += [(f"{model_key(m)}.policy", s.policy) for m, s in config.models.items() if s.policy]
    for key, name in policies:
        if name not in KNOWN_POLICIES:
            raise ConfigError(f"{source}: {key}: unknown policy {name!r}, expected one of {list(KNOWN_POLICIES)}")
    models = {b.model for b in config.backends}
    discovered = {b.name for b in config.backends if b.discover == "dns"}
    for model, section in config.models.items():
        if model not in models:
            raise ConfigError(f"{source}: {model_key(model)}: no backend serves model {model!r}")
        if section.pinned_backend and section.pinned_backend not in seen:
            raise ConfigError(
                f"{source}: {model_key(model)}.pinned_backend: unknown backend {section.pinned_backend!r}"
            )
        if section.pinned_backend in discovered:
            raise ConfigError(
                f'{source}: {model_key(model)}.pinned_backend: {section.pinned_backend!r} is a discover = "dns" '
                "entry, whose members come and go: pin a backend of a fixed URL"
            )
        _check_model_options(config, model, section, source)
    for model in models:  # build each policy once: its own checks (objective, options) name the key
        policy = config.policy_for(model)
        key = model_key(model) if model in config.models else "gateway"
        try:
            make_policy(policy, **config.policy_options(model, policy))
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{source}: {key}: policy {policy!r}: {e}") from None


def _check_backend_key(entry: BackendEntry, where: str) -> None:
    if entry.api_key is not None and entry.api_key_env is not None:
        raise ConfigError(f"{where}: expected at most one of api_key and api_key_env, got both")
    if entry.api_key is not None and not entry.api_key.strip():
        raise ConfigError(f"{where}.api_key: expected a non-empty key (or no api_key: the upstream has none)")
    if entry.api_key_env is not None:
        if not _ENV_NAME.fullmatch(entry.api_key_env):
            raise ConfigError(
                f"{where}.api_key_env: expected an environment variable name (letters, digits, '_', "
                f"not starting with a digit), got {entry.api_key_env!r}"
            )
        backend_api_key(entry, where)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_lists(config: Config, source: str) -> None:
    for key in ("ttft_buckets_s", "duration_buckets_s"):
        bounds = getattr(config.metrics, key)
        if len(bounds) > MAX_BUCKETS or not all(math.isfinite(b) and b > 0 for b in bounds):
            raise ConfigError(
                f"{source}: metrics.{key}: expected at most {MAX_BUCKETS} finite bounds > 0, got {bounds!r}"
            )
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ConfigError(f"{source}: metrics.{key}: expected ascending bounds, got {bounds!r}")
    for server in config.discovery.nameservers:
        if nameserver_address(server) is None:
            raise ConfigError(
                f"{source}: discovery.nameservers: expected an IP address, optionally with a port "
                f"(10.96.0.10, 127.0.0.1:5353, [fd00::a]:53), got {server!r}"
            )


def nameserver_address(server: str) -> tuple[str, int] | None:
    """(IP, port) of a `discovery.nameservers` entry ("IP", "IP:PORT", "[IPv6]:PORT"), or None if malformed."""
    host, port = server, 53
    if server.startswith("["):
        host, sep, rest = server[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        if rest:
            if not rest[1:].isdigit():
                return None
            port = int(rest[1:])
    elif server.count(":") == 1:
        host, _, text = server.partition(":")
        if not text.isdigit():
            return None
        port = int(text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return (host, port) if 1 <= port <= 65535 else None


def config_digest(config: Config) -> str:
    """A short digest of what `config` runs, its listen address aside (replicas that share one file
    may each be told another with --listen): equal on every replica that runs the same file."""
    plain = msgspec.structs.replace(config, gateway=msgspec.structs.replace(config.gateway, listen=""))
    return hashlib.sha256(msgspec.json.encode(plain)).hexdigest()[:16]


def _check_auth(auth: AuthSection, source: str) -> None:
    _check_priority_range(auth.priority_range, f"{source}: auth.priority_range")
    for path in auth.public_paths:
        if not path.startswith("/") or path.startswith("/admin"):
            raise ConfigError(
                f"{source}: auth.public_paths: expected paths beginning with '/' outside the admin API, got {path!r}"
            )
    names: set[str] = set()
    for i, client in enumerate(auth.clients):
        where = f"{source}: auth.clients[{i}]"
        if not client.name.strip() or client.name in names:
            raise ConfigError(f"{where}.name: expected a non-empty name of its own, got {client.name!r}")
        names.add(client.name)
        if (client.key is None) == (client.key_env is None):
            raise ConfigError(f"{where}: expected one of key or key_env")
        if client.key is not None and not client.key.strip():
            raise ConfigError(f"{where}.key: expected a non-empty key")
        _check_priority_range(client.priority_range, f"{where}.priority_range")


def _check_priority_range(value: list[int], where: str) -> None:
    if not value:
        return
    if len(value) != 2 or value[0] > value[1] or not all(priority_in_range(v) for v in value):
        raise ConfigError(f"{where}: expected [lowest, highest], two signed 64-bit integers, got {value!r}")


def _endpoint_problem(endpoint: str, protocol: str) -> str | None:
    """An OTLP endpoint: a base URL; over gRPC also HOST:PORT, as the OTLP gRPC exporter takes it."""
    if protocol == "grpc" and "://" not in endpoint:
        try:
            parse_listen(endpoint, "endpoint")
        except ConfigError:
            return f"expected an http:// or https:// URL or HOST:PORT (a port in 1..65535), got {endpoint!r}"
        return None
    return url_problem(endpoint)


def _check_model_options(config: Config, model: str, section: ModelSection, source: str) -> None:
    """A model section's option its policy does not take is refused by name, not ignored. With
    `gateway.allow_policy_header` an option of a policy a client may choose is kept for that one."""
    policy = config.policy_for(model)
    takes = POLICY_OPTIONS.get(policy, frozenset())
    chosen = HEADER_POLICIES if config.gateway.allow_policy_header else ()
    options = _section_options(section)
    for option in options:
        if option in takes or any(option in POLICY_OPTIONS[p] for p in chosen):
            continue
        own = sorted(takes & set(MODEL_OPTIONS))
        raise ConfigError(
            f"{source}: {model_key(model)}: {option}: not an option of policy {policy}"
            f" ({'its options: ' + ', '.join(own) if own else 'it takes none'})"
        )
    for option, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: {model_key(model)}.{option}: expected a finite number, got {value}")


# Every numeric key: (lowest, lowest allowed itself?, highest or None). Floats must be finite too
# (TOML has nan and inf; `nan <= 0` is false, so a bare comparison would let it through).
_RANGES: dict[str, tuple[float, bool, float | None]] = {
    "gateway.shutdown_grace_s": (0, True, None),  # 0: end what is open at once
    "gateway.max_body_bytes": (1, True, None),
    "gateway.upstream_connections": (1, True, None),
    "gateway.max_body_bytes_in_flight": (1, True, None),
    "gateway.max_response_bytes": (1, True, None),
    "gateway.max_connections": (1, True, None),
    "gateway.response_lookups": (1, True, None),
    "gateway.config_watch_s": (0, True, None),  # 0: never
    "timeouts.connect_s": (0, False, None),
    "timeouts.first_byte_s": (0, False, None),
    "timeouts.idle_stream_s": (0, False, None),
    "timeouts.request_s": (0, False, None),
    "timeouts.client_body_s": (0, False, None),
    "timeouts.client_header_s": (0, False, None),
    "timeouts.client_send_s": (0, False, None),
    "retry.attempts": (1, True, None),  # 1: no retry
    "retry.backoff_initial_s": (0, True, None),
    "retry.backoff_max_s": (0, True, None),
    "retry.deadline_s": (0, False, None),
    "retry.quarantine_after": (0, True, None),  # 0: never
    "retry.quarantine_s": (0, True, None),
    "retry.budget_share": (0, True, None),
    "retry.budget_window_s": (0, False, None),
    "retry.budget_min_retries_per_s": (0, True, None),
    "health.interval_s": (0, False, None),
    "health.unhealthy_after": (1, True, None),
    "health.healthy_after": (1, True, None),
    "health.circuit_failures": (1, True, None),
    "health.circuit_cooldown_s": (0, True, None),  # 0: the probe may go at once
    "health.circuit_max_cooldown_s": (0, True, None),
    "health.max_ejected_share": (0, True, 1),
    "health.engine_check_s": (0, True, None),  # 0: never
    "health.engine_check_timeout_s": (0, False, None),
    "health.models_refresh_s": (0, True, None),  # 0: at start and restarts only
    "admission.max_inflight": (1, True, None),
    "admission.backend_max_inflight": (0, True, None),  # 0: the backend's max_running_requests
    "admission.max_queue": (0, True, None),  # 0: no queue, 429 at once
    "admission.queue_timeout_s": (0, True, None),
    "auth.rate_limit_rps": (0, True, None),  # 0: off
    "auth.rate_limit_burst": (0, True, None),  # 0: max(1, rps)
    "tracing.sample_ratio": (0, True, 1),  # None: unset
    "discovery.resolve_s": (0, False, None),
    "discovery.resolve_timeout_s": (0, False, None),
}


def _check_ranges(config: Config, source: str) -> None:
    for key, (low, low_ok, high) in _RANGES.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(config, section), name)
        if value is None:
            continue
        bound = f"{'>=' if low_ok else '>'} {low:g}" if high is None else f"in [{low:g}, {high:g}]"
        what = "a finite number" if isinstance(value, float) else "a whole number"
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: {key}: expected {what} {bound}, got {value}")
        if value < low or (value == low and not low_ok) or (high is not None and value > high):
            raise ConfigError(f"{source}: {key}: expected a value {bound}, got {value}")
