"""Options of one twin server, resolved by the CLI (plain data, no behaviour)."""

from __future__ import annotations

import msgspec

__all__ = ["FaultOptions", "LORA_TARGET_MODULES", "LoraAdapter", "LoraOptions", "PriorityOptions", "ServerOptions"]

# `utils/common.py: SUPPORTED_LORA_TARGET_MODULES` + LORA_TARGET_ALL_MODULES
LORA_TARGET_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "q_a_proj",
    "kv_a_proj_with_mqa",
    "q_b_proj",
    "kv_b_proj",
    "wq_b",
    "wk",
    "weights_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
    "embed_tokens",
    "lm_head",
    "qkvr",
    "wo_ud",
    "all",
)


class FaultOptions(msgspec.Struct, kw_only=True):
    """Fault knobs for reliability tests; all off by default."""

    latency_ms: float = 0.0  # added before the response starts
    error_rate: float = 0.0  # fraction of generation requests answered 5xx before the first byte
    # that answer's status: 500 is SGLang's for a request that failed, 502/503 a proxy's or server's
    # in front of one that is gone
    error_status: int = 500
    crash_after_tokens: int | None = None  # process exits once this many tokens were delivered
    hang_after_tokens: int | None = None  # step loop stops (requests hang) after this many tokens
    crash_on_prompt: str | None = None  # process exits when a generation request's prompt contains this
    slow_ready_s: float = 0.0  # /ready, /health answer 503 for this many seconds after start
    accept_drop_at_s: float | None = None  # wall seconds after start when acceptance drops
    accept_drop_to: float = 0.5  # acceptance multiplier after the drop


class LoraAdapter(msgspec.Struct, frozen=True, kw_only=True):
    """One `--lora-paths` entry, normalized (`arg_groups/lora_hook.py: check_lora_server_args`)."""

    name: str
    path: str
    pinned: bool = False


class LoraOptions(msgspec.Struct, kw_only=True):
    """The `lora` namespace as SGLang resolves it (`arg_groups/fields/lora.py`); off by default."""

    enable_lora: bool = False  # --enable-lora, or implied by --lora-paths
    lora_paths: tuple[LoraAdapter, ...] = ()
    max_loaded_loras: int | None = None
    max_loras_per_batch: int = 8
    max_lora_rank: int | None = None
    lora_target_modules: tuple[str, ...] | None = None
    # assumption (not SGLang): adapter requests' per-draft acceptance is multiplied by this
    acceptance_scale: float = 1.0


class PriorityOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Request priority, SGLang's flags of the `schedule` namespace (`arg_groups/fields/schedule.py`)
    under their own names and defaults; off by default."""

    enable_priority_scheduling: bool = False  # higher integer first, FCFS within a priority
    schedule_low_priority_values_first: bool = False  # with the above: lower integer first
    default_priority_value: int | None = None  # a request without `priority` gets it (scheduling on)
    abort_on_priority_when_disabled: bool = False  # scheduling off: a request with `priority` gets 503
    disable_priority_preemption: bool = False  # scheduling on: no retraction of running requests
    priority_scheduling_preemption_threshold: int = 10  # a difference above it retracts a running one


class ServerOptions(msgspec.Struct, kw_only=True):
    """Everything the CLI resolves before starting the server."""

    host: str = "127.0.0.1"
    port: int = 30000
    seed: int = 0
    time_scale: float = 1.0
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    served_model_name: str | None = None
    context_length: int | None = None  # --context-length, as given (None: the model's own)
    enable_metrics: bool = False
    compat: str | None = None  # "0.5.9": imitate an older 0.5.x
    incremental_streaming_output: bool = False
    enable_cache_report: bool = False  # usage.prompt_tokens_details.cached_tokens
    reasoning_parser: str | None = None  # "kimi_k2": reasoning_content split from content
    tool_call_parser: str | None = None  # "kimi_k2": delta.tool_calls parsed from the markup
    enable_response_store: bool = False  # /v1/responses: store, retrieve, chain, background
    faults: FaultOptions = msgspec.field(default_factory=FaultOptions)
    lora: LoraOptions = msgspec.field(default_factory=LoraOptions)
    priority: PriorityOptions = msgspec.field(default_factory=PriorityOptions)
