"""Options of one twin server, resolved by the CLI (plain data, no behaviour)."""

from __future__ import annotations

import msgspec

__all__ = ["FaultOptions", "ServerOptions"]


class FaultOptions(msgspec.Struct, kw_only=True):
    """Fault knobs for reliability tests; all off by default."""

    latency_ms: float = 0.0  # added before the response starts
    error_rate: float = 0.0  # fraction of generation requests answered 5xx before the first byte
    crash_after_tokens: int | None = None  # process exits once this many tokens were delivered
    hang_after_tokens: int | None = None  # step loop stops (requests hang) after this many tokens
    slow_ready_s: float = 0.0  # /ready, /health answer 503 for this many seconds after start
    accept_drop_at_s: float | None = None  # wall seconds after start when acceptance drops
    accept_drop_to: float = 0.5  # acceptance multiplier after the drop


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
    faults: FaultOptions = msgspec.field(default_factory=FaultOptions)
