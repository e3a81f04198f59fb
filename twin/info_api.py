"""Info, load and health endpoints: what the gateway's poller and a user's tooling read.

Field lists follow SGLang 0.5.23 (`entrypoints/v1_loads.py`, `managers/load_snapshot.py`,
`managers/scheduler_components/load_inquirer.py`). Queue and token gauges are live; the
speculative section of `/v1/loads` is SGLang's: `accept_length` is the lifetime average since
start and `accept_rate` the last interval's rate, both published every 40 decode steps, the
section absent before the first publication and on AR servers. `cache_hit_rate` is the last
prefill batch's hit rate, computed only with `--enable-metrics` (0.0 otherwise), as in SGLang.
Rates are in simulated time: `gen_throughput` is what the real server would report, whatever
`--time-scale` the twin runs at.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from typing import Any

import msgspec
from aiohttp import web

from twin.engine import QueueFull
from twin.profile import Profile
from twin.state import STATE_KEY, SimState, new_rid

__all__ = ["routes"]

_encode = msgspec.json.Encoder().encode


_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=_encode(obj), status=status, content_type="application/json")


def server_args(state: SimState) -> dict[str, Any]:
    """Flat resolved server arguments, as `/server_info` reports them."""
    p = state.profile
    spec = p.speculative
    o = state.options
    ddtree = spec is not None and spec.algorithm == "DDTREE"
    return {
        "model_path": p.model_path,
        "tokenizer_path": p.model_path,
        "served_model_name": state.served_model_name,
        "host": o.host,
        "port": o.port,
        "tp_size": p.tp_size,
        "dp_size": 1,
        # the --context-length override, null without it (`arg_groups/fields/model.py`); the model's
        # own is in /v1/models' max_model_len
        "context_length": o.context_length,
        # SGLang fills this only from the flag or its speculative hooks (48): null on AR.
        "max_running_requests": (
            o.max_running_requests
            if o.max_running_requests is not None
            else state.max_running_requests
            if spec
            else None
        ),
        "max_queued_requests": o.max_queued_requests,
        "schedule_policy": "fcfs",  # SGLang's default, the only policy the twin has
        # the request-priority flags under SGLang's names (`arg_groups/fields/schedule.py`)
        "enable_priority_scheduling": o.priority.enable_priority_scheduling,
        "disable_priority_preemption": o.priority.disable_priority_preemption,
        "default_priority_value": o.priority.default_priority_value,
        "abort_on_priority_when_disabled": o.priority.abort_on_priority_when_disabled,
        "schedule_low_priority_values_first": o.priority.schedule_low_priority_values_first,
        "priority_scheduling_preemption_threshold": o.priority.priority_scheduling_preemption_threshold,
        "max_total_tokens": p.max_total_num_tokens,
        "attention_backend": p.attention_backend,
        "enable_metrics": o.enable_metrics,
        "incremental_streaming_output": o.incremental_streaming_output,
        "random_seed": o.seed,
        "enable_cache_report": o.enable_cache_report,
        "reasoning_parser": o.reasoning_parser,
        "tool_call_parser": o.tool_call_parser,
        # the page size SGLang resolves: trtllm_mla forces 64 (`arg_groups/overrides.py`); the
        # DDTree pull request needs 1
        "page_size": 1 if ddtree else 64 if p.attention_backend == "trtllm_mla" else 1,
        # attention data parallelism: never on a twin (`--attn-dp-size` is refused, cli.py);
        # `enable_dp_attention` is the deprecated resolved flag (`server_args.py`)
        "attn_dp_size": 1,
        "enable_dp_attention": False,
        # the overlap scheduler: on unless disabled; the DDTree pull request turns it off
        "disable_overlap_schedule": ddtree,
        # mixed chunked prefill: off by default, and NGRAM forces it off (`_handle_ngram`)
        "enable_mixed_chunk": False,
        "speculative_algorithm": spec.algorithm if spec else None,
        "speculative_draft_model_path": spec.draft_model_path if spec else None,
        "speculative_num_steps": spec.num_steps if spec else None,
        "speculative_eagle_topk": spec.eagle_topk if spec else None,
        "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
        "speculative_dflash_block_size": spec.dflash_block_size if spec else None,
        "speculative_ddtree_budget": spec.ddtree_budget if spec else None,
        "speculative_draft_window_size": spec.draft_window_tokens if spec else None,
        "speculative_draft_attention_backend": "fa4" if spec and spec.draft_model_path else None,
        **_ngram_args(p),
        "sim_profile": p.name,
        "sim_time_scale": state.runtime.time_scale,
    }


def _ngram_args(p: Profile) -> dict[str, Any]:
    """The `speculative_ngram_*` fields (`arg_groups/fields/spec.py`): SGLang reports their
    values on every server, defaults when NGRAM is off."""
    ng = p.ngram
    spec = p.speculative
    breadth = spec.eagle_topk if spec is not None and ng is not None else 10
    return {
        "speculative_ngram_min_bfs_breadth": 1,
        "speculative_ngram_max_bfs_breadth": breadth,
        "speculative_ngram_match_type": "BFS",
        "speculative_ngram_max_trie_depth": ng.max_trie_depth if ng else 18,
        "speculative_ngram_capacity": ng.trie_capacity if ng else 10_000_000,
        "speculative_ngram_external_corpus_path": None,
        "speculative_ngram_external_sam_budget": 0,
        "speculative_ngram_external_corpus_max_tokens": 10_000_000,
    }


async def server_info(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    st = state.engine.stats()
    info = server_args(state)
    info["version"] = state.version
    internal: dict[str, Any] = {
        "effective_max_running_requests_per_dp": state.max_running_requests,
        "last_gen_throughput": st.gen_throughput,
        "memory_usage": {"token_capacity": state.profile.max_total_num_tokens},
    }
    if st.lifetime_accept_length is not None:  # internal_state.py: only once published
        internal["avg_spec_accept_length"] = st.lifetime_accept_length
    info["internal_states"] = [internal]
    return _json(info)


async def model_info(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    p = state.profile
    return _json(
        {
            "model_path": p.model_path,
            "tokenizer_path": p.model_path,
            "served_model_name": state.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": p.served_model_name.split("-")[0],
            "architectures": None,
        }
    )


def _model_card(state: SimState) -> dict[str, Any]:
    """SGLang's ModelCard for the served model: `root` is the served name too (`entrypoints/http_server.py`,
    `available_models`), `max_model_len` the context length."""
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "sglang",
        "root": state.served_model_name,
        "parent": None,
        "max_model_len": state.profile.context_length,
    }


def _adapter_cards(state: SimState) -> list[dict[str, Any]]:
    """One ModelCard per loaded LoRA adapter, after the base card, in the registry's LRU order, only
    with LoRA enabled: `id` the adapter's name, `root` its path, `parent` the served name,
    `max_model_len` null (`entrypoints/http_server.py: available_models`). `created` is the base
    card's (SGLang stamps each card as it lists them: one listing's cards agree to the second)."""
    if not state.lora.enabled:
        return []
    return [
        {
            "id": ref.lora_name,
            "object": "model",
            "created": state.created,
            "owned_by": "sglang",
            "root": ref.lora_path,
            "parent": state.served_model_name,
            "max_model_len": None,
        }
        for ref in state.lora.adapters()
    ]


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return _json({"object": "list", "data": [_model_card(state), *_adapter_cards(state)]})


async def retrieve_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{model}` (`entrypoints/http_server.py`, `retrieve_model`): the card, or a 404 in
    OpenAI's error shape for another name, a LoRA adapter's (or "served:adapter") included: SGLang
    looks up the served name only."""
    state = request.app[STATE_KEY]
    model = request.match_info["model"]
    if model != state.served_model_name:
        error = {
            "message": f"The model '{model}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        return _json({"error": error}, status=404)
    return _json(_model_card(state))


# The decode moments that are durations: the sums of step time (us) and of batch x step time.
_STEP_TIME, _BATCH_TIME = 2, 4


def wall_clock_counters(moments: tuple[float, ...] | None, prefill_busy_us: int, time_scale: float) -> dict[str, Any]:
    """The duration counters of `/v1/loads` (prefill busy time, the decode moments' step times) on the
    wall clock: the engine counts simulated seconds, and a twin at `--time-scale F` takes F times
    those. A client times the twin's answers on its wall clock, as it would a real server's; the
    counters then agree with them, as SGLang's do (a gateway learns step time from both)."""
    if moments and time_scale != 1.0:
        moments = tuple(x * time_scale if i in (_STEP_TIME, _BATCH_TIME) else x for i, x in enumerate(moments))
    return {
        "total_prefill_busy_us": round(prefill_busy_us * time_scale),
        "decode_moments": list(moments) if moments else None,
    }


def load_entry(state: SimState, include: set[str] | None = None) -> dict[str, Any]:
    """One DP rank's `LoadSnapshot.to_dict(include)`: core keys always, sections by `include`."""
    st = state.engine.stats()
    pending = state.engine.waiting_prompt_tokens()
    load: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": st.num_running,
        "num_waiting_reqs": st.num_waiting,
        "num_waiting_uncached_tokens": pending,
        "num_used_tokens": st.num_used_tokens,
        "num_total_tokens": st.num_used_tokens + pending,
        "num_active_tokens": st.num_used_tokens + pending,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": state.profile.max_total_num_tokens,
        "max_running_requests": state.max_running_requests,
        "token_usage": round(st.token_usage, 4),
        "gen_throughput": round(st.gen_throughput, 2),
        "cache_hit_rate": round(st.cache_hit_rate, 4) if state.options.enable_metrics else 0.0,
        "utilization": round(st.num_running / state.max_running_requests, 4),
        "total_prefill_uncached_tokens": st.total_prompt_tokens,
        **wall_clock_counters(st.decode_moments, st.total_prefill_busy_us, state.runtime.time_scale),
    }
    if include == {"core"}:
        return load
    sections = _SECTIONS if include is None or "all" in include else include
    if "memory" in sections:
        load["memory"] = {
            "weight_gb": 0.0,
            "kv_cache_gb": 0.0,
            "graph_gb": 0.0,
            "token_capacity": state.profile.max_total_num_tokens,
        }
    if st.lifetime_accept_length is not None and "spec" in sections:
        load["speculative"] = {"accept_length": st.lifetime_accept_length, "accept_rate": st.accept_rate}
    if "disagg" in sections:
        load["disaggregation"] = {
            "mode": "null",
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        }
    if "queues" in sections:
        load["queues"] = {"waiting": st.num_waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}
    return load


async def loads(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if state.legacy:
        raise web.HTTPNotFound()
    inc = request.query.get("include")
    include = {s.strip() for s in inc.split(",")} if inc else None
    if include is not None and not include <= _SECTIONS:
        bad = include - _SECTIONS
        msg = f"Invalid include sections: {bad}. Valid options: {sorted(_SECTIONS)}"
        return _json({"object": "error", "message": msg, "type": "400", "param": None, "code": 400}, status=400)
    return _json(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": state.version,
            "accelerator": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "num_accelerators": state.profile.tp_size,
            "loads": [load_entry(state, include)],
        }
    )


async def get_load(request: web.Request) -> web.Response:
    """Older 0.5.x `/get_load`: a list with one entry per DP rank (gone in 0.5.23)."""
    state = request.app[STATE_KEY]
    if not state.legacy:
        raise web.HTTPNotFound()
    st = state.engine.stats()
    return _json(
        [
            {
                "dp_rank": 0,
                "num_reqs": st.num_running + st.num_waiting,
                "num_waiting_reqs": st.num_waiting,
                "num_tokens": st.num_used_tokens,
            }
        ]
    )


async def ready(request: web.Request) -> web.Response:
    """200 while started, not shutting down and not judged unhealthy by a /health check
    (`tokenizer_manager.is_ready`: not paused and `server_status == Up`)."""
    state = request.app[STATE_KEY]
    return web.Response(status=200 if state.ready and state.healthy else 503)


MIN_HEALTH_TIMEOUT_S = 2.0


def _health_check_timeout_s() -> float:
    """`HEALTH_CHECK_TIMEOUT` (`entrypoints/http_server.py`): SGLANG_HEALTH_CHECK_TIMEOUT, default 20."""
    try:
        return float(int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
    except ValueError:
        return 20.0


async def health(request: web.Request) -> web.Response:
    """`/health` and `/health_generate`, as SGLang's `health_generate`: looked at once a second, the
    check passes once the engine has finished a step after it began. On an idle server that step is
    the check's own 1-token request; a busy one does not queue it (`scheduler.py`: "ongoing requests
    already carry health info") and answers after its next batch, a prefill chunk too, so a long
    prefill passes. No step for the whole timeout (a hung scheduler): 503, and the server counts
    as unhealthy (/ready 503) until a later check passes. The second and the timeout are scaled by
    --time-scale like every duration the twin simulates (assumption: SGLang's are wall-clock), the
    timeout to no less than `MIN_HEALTH_TIMEOUT_S` of wall-clock, so that a busy test machine's
    scheduling delays never pass for a hung engine."""
    state = request.app[STATE_KEY]
    if not state.ready:  # starting, or shutting down
        return web.Response(status=503)
    runtime = state.runtime
    tick = runtime.time_scale
    began = time.monotonic()
    deadline = began + max(MIN_HEALTH_TIMEOUT_S, _health_check_timeout_s() * tick)
    rid = "HEALTH_CHECK_" + new_rid()
    queued = state.engine.idle
    if queued:
        try:
            runtime.submit(rid, 1, 1, "")
        except QueueFull:
            queued = False
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(tick)
            if runtime.last_step_at > began:
                state.healthy = True
                return web.Response(status=200)
    finally:
        if queued:
            runtime.release(rid)
    state.healthy = False
    return web.Response(status=503)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/server_info", server_info),
        web.get("/get_server_info", server_info),
        web.get("/model_info", model_info),
        web.get("/get_model_info", model_info),
        web.get("/v1/models", models),
        web.get("/v1/models/{model:.+}", retrieve_model),
        web.get("/v1/loads", loads),
        web.get("/get_load", get_load),
        web.get("/ready", ready),
        web.get("/health", health),
        web.get("/health_generate", health),
    ]
