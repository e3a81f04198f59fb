"""What a live SGLang server says about itself: the facts onboarding and profiling start from.

Read on the gateway's own client (`backends.client.SGLangClient`): `/server_info` (fallback
`/get_server_info`, the only one of older 0.5.x releases), `/v1/models` (the model card's
`max_model_len`: `/server_info`'s `context_length` is only the `--context-length` override) and
`/v1/loads` (fallback `/get_load`): the running and waiting requests, the cap, the KV budget, and
whether the server keeps the counters a sweep fits step and prefill time from
(`decode_moments`, `total_prefill_busy_us`, SGLang 0.5.23).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import msgspec

from backends import BackendSpec
from backends.client import SGLangClient
from backends.loads import LoadReport, parse_get_load, parse_loads, parse_model_cards
from tools.fit.algorithms import Classification, classify, verify_width

__all__ = ["ServerFacts", "discover", "discover_all", "read_load"]


class ServerFacts(msgspec.Struct, kw_only=True):
    url: str
    reachable: bool = False
    error: str | None = None  # why it could not be read (unreachable, no server info)
    info_path: str | None = None  # /server_info or /get_server_info
    version: str | None = None
    served_model_name: str | None = None
    model_path: str | None = None
    context_length: int | None = None  # the model card's max_model_len (or the override)
    classification: Classification | None = None
    max_running_requests: int | None = None  # the cap: /server_info, else /v1/loads (AR servers)
    max_total_tokens: int | None = None  # the KV pool in tokens
    tp_size: int | None = None
    attention_backend: str | None = None
    speculative: dict[str, Any] = {}  # the speculative_* fields as reported
    verify_width: int | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_metrics: bool = False
    enable_cache_report: bool = False
    stream_interval: int | None = None
    sim_time_scale: float | None = None  # a twin's --time-scale (SGLang reports none)
    sim_profile: str | None = None
    load_path: str | None = None  # /v1/loads or /get_load
    running: int | None = None
    waiting: int | None = None
    decode_moments: bool = False  # /v1/loads carries decode_moments
    prefill_counters: bool = False  # /v1/loads carries total_prefill_busy_us

    @property
    def time_scale(self) -> float:
        """Wall seconds per second of the hardware the server stands for: a twin's time scale, 1 otherwise."""
        return self.sim_time_scale if self.sim_time_scale and self.sim_time_scale > 0 else 1.0

    @property
    def thinking(self) -> bool:
        """The model thinks behind a reasoning parser (a chat template switch turns it off)."""
        return bool(self.reasoning_parser)


def _int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


_SPEC_KEYS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_dflash_block_size",
    "speculative_ddtree_budget",
    "speculative_draft_window_size",
    "speculative_ngram_max_trie_depth",
    "speculative_ngram_capacity",
)


def _apply_info(facts: ServerFacts, info: dict[str, Any]) -> None:
    facts.version = _str(info.get("version"))
    facts.served_model_name = _str(info.get("served_model_name")) or _str(info.get("model_path"))
    facts.model_path = _str(info.get("model_path"))
    facts.context_length = _int(info.get("context_length"))
    facts.classification = classify(info.get("speculative_algorithm"))
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    facts.max_running_requests = _int(info.get("max_running_requests")) or _int(
        first.get("effective_max_running_requests_per_dp")
    )
    memory = first.get("memory_usage")
    memory = memory if isinstance(memory, dict) else {}
    facts.max_total_tokens = (
        _int(info.get("max_total_num_tokens"))
        or _int(info.get("max_total_tokens"))
        or _int(memory.get("token_capacity"))
    )
    facts.tp_size = _int(info.get("tp_size"))
    facts.attention_backend = _str(info.get("attention_backend"))
    facts.speculative = {k: info[k] for k in _SPEC_KEYS if info.get(k) is not None}
    facts.verify_width = verify_width(info)
    facts.reasoning_parser = _str(info.get("reasoning_parser"))
    facts.tool_call_parser = _str(info.get("tool_call_parser"))
    facts.enable_metrics = info.get("enable_metrics") is True
    facts.enable_cache_report = info.get("enable_cache_report") is True
    facts.stream_interval = _int(info.get("stream_interval"))
    scale = info.get("sim_time_scale")
    facts.sim_time_scale = float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) else None
    facts.sim_profile = _str(info.get("sim_profile"))


async def read_load(client: SGLangClient, facts: ServerFacts, timeout_s: float = 30.0) -> LoadReport | None:
    """`/v1/loads` summed over DP ranks, else `/get_load` (older servers: running and waiting only),
    else None. Updates `facts`' running, waiting, cap, KV pool and which counters it keeps."""
    if facts.load_path != "/get_load":
        status, raw = await client.get("/v1/loads?include=core", timeout_s=timeout_s)
        if status == 200:
            data = _json(raw)
            report = parse_loads(data)
            if report is not None:
                facts.load_path = "/v1/loads"
                facts.running, facts.waiting = report.running, report.waiting
                facts.max_running_requests = facts.max_running_requests or report.max_running
                facts.max_total_tokens = facts.max_total_tokens or report.max_total_tokens
                facts.decode_moments = report.decode_moments is not None
                facts.prefill_counters = report.prefill_counters is not None
                return report
    status, raw = await client.get("/get_load", timeout_s=timeout_s)
    report = parse_get_load(_json(raw)) if status == 200 else None
    if report is None:
        facts.load_path = None
        return None
    facts.load_path = "/get_load"
    facts.running, facts.waiting = report.running, report.waiting
    return report


async def discover(url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> ServerFacts:
    """Read one server; never raises: what went wrong is in `error`."""
    facts = ServerFacts(url=url.rstrip("/"))
    client = SGLangClient(
        BackendSpec(name="discover", url=facts.url, model="", api_key=api_key), connect_timeout_s=timeout_s
    )
    try:
        for path in ("/server_info", "/get_server_info"):
            status, raw = await client.get(path, timeout_s=timeout_s)
            facts.reachable = True
            data = _json(raw) if status == 200 else None
            if isinstance(data, dict):
                facts.info_path = path
                _apply_info(facts, data)
                break
            if status in (401, 403):
                facts.error = f"{path} answered {status}: the server needs an API key (--api-key-env)"
                return facts
        if facts.info_path is None:
            facts.error = "neither /server_info nor /get_server_info answered with JSON: not an SGLang server?"
            return facts
        status, raw = await client.get("/v1/models", timeout_s=timeout_s)
        cards = parse_model_cards(_json(raw), facts.served_model_name) if status == 200 else None
        if cards is not None and cards.max_model_len:
            facts.context_length = cards.max_model_len
        await read_load(client, facts, timeout_s)
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        facts.error = f"unreachable: {type(e).__name__}: {e}".rstrip(": ")
    finally:
        await client.close()
    return facts


async def discover_all(urls: list[str], *, api_key: str | None = None, timeout_s: float = 10.0) -> list[ServerFacts]:
    return list(await asyncio.gather(*(discover(u, api_key=api_key, timeout_s=timeout_s) for u in urls)))
