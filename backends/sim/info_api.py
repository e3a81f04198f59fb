"""Info, load and health endpoints: what the gateway's poller and a user's tooling read.

Field lists follow SGLANG_API.md (SGLang 0.5.23). Loads are computed live from the engine
(SGLang refreshes them every few decode iterations; live is a strictly fresher special case).
Rates are in simulated time: `gen_throughput` is what the real server would report, whatever
`--time-scale` the twin runs at.
"""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from backends.sim.engine import QueueFull
from backends.sim.state import STATE_KEY, SimState, new_rid

__all__ = ["routes"]

_encode = msgspec.json.Encoder().encode


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=_encode(obj), status=status, content_type="application/json")


def server_args(state: SimState) -> dict:
    """Flat resolved server arguments, as `/server_info` reports them."""
    p = state.profile
    spec = p.speculative
    o = state.options
    return {
        "model_path": p.model_path,
        "tokenizer_path": p.model_path,
        "served_model_name": state.served_model_name,
        "host": o.host,
        "port": o.port,
        "tp_size": p.tp_size,
        "dp_size": 1,
        "context_length": p.context_length,
        "max_running_requests": state.max_running_requests,
        "max_queued_requests": o.max_queued_requests,
        "max_total_tokens": p.max_total_num_tokens,
        "attention_backend": p.attention_backend,
        "enable_metrics": o.enable_metrics,
        "incremental_streaming_output": o.incremental_streaming_output,
        "random_seed": o.seed,
        "speculative_algorithm": spec.algorithm if spec else None,
        "speculative_draft_model_path": spec.draft_model_path if spec else None,
        "speculative_num_steps": spec.num_steps if spec else None,
        "speculative_eagle_topk": spec.eagle_topk if spec else None,
        "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
        "speculative_dflash_block_size": spec.dflash_block_size if spec else None,
        "speculative_ddtree_budget": spec.ddtree_budget if spec else None,
        "speculative_draft_attention_backend": "fa4" if spec else None,
        "sim_profile": p.name,
        "sim_time_scale": state.runtime.time_scale,
    }


async def server_info(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    st = state.engine.stats()
    info = server_args(state)
    info["version"] = state.version
    info["internal_states"] = [{
        "avg_spec_accept_length": st.avg_accept_length if state.profile.is_speculative else None,
        "effective_max_running_requests_per_dp": state.max_running_requests,
        "last_gen_throughput": st.gen_throughput,
        "memory_usage": {"token_capacity": state.profile.max_total_num_tokens},
    }]
    return _json(info)


async def model_info(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    p = state.profile
    return _json({"model_path": p.model_path, "tokenizer_path": p.model_path,
                  "served_model_name": state.served_model_name, "is_generation": True,
                  "preferred_sampling_params": None, "weight_version": "default",
                  "has_image_understanding": False, "has_audio_understanding": False,
                  "model_type": p.served_model_name.split("-")[0],
                  "architectures": None})


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return _json({"object": "list", "data": [{
        "id": state.served_model_name, "object": "model", "created": state.created,
        "owned_by": "sglang", "root": state.profile.model_path, "parent": None,
        "max_model_len": state.profile.context_length}]})


def load_entry(state: SimState, include: set[str] | None = None) -> dict:
    """One DP rank's load; `include` selects sections (core, spec) like `?include=`."""
    st = state.engine.stats()
    out: dict = {"dp_rank": 0}
    if include is None or "core" in include:
        out.update({
            "num_running_reqs": st.num_running,
            "num_waiting_reqs": st.num_waiting,
            "num_used_tokens": st.num_used_tokens,
            "max_total_num_tokens": state.profile.max_total_num_tokens,
            "max_running_requests": state.max_running_requests,
            "token_usage": round(st.token_usage, 6),
            "gen_throughput": round(st.gen_throughput, 3),
            "cache_hit_rate": 0.0,
            "utilization": st.num_running / state.max_running_requests,
        })
    if include is None or "spec" in include:
        out["speculative"] = ({"accept_length": round(st.accept_length, 4),
                               "accept_rate": round(st.accept_rate, 4)}
                              if state.profile.is_speculative else None)
    return out


async def loads(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if state.legacy:
        raise web.HTTPNotFound()
    inc = request.query.get("include")
    include = {s.strip() for s in inc.split(",")} if inc else None
    if include and "all" in include:
        include = None
    return _json({"timestamp": time.time(), "version": state.version,
                  "loads": [load_entry(state, include)]})


async def get_load(request: web.Request) -> web.Response:
    """Older 0.5.x `/get_load`: a list with one entry per DP rank (gone in 0.5.23)."""
    state = request.app[STATE_KEY]
    if not state.legacy:
        raise web.HTTPNotFound()
    st = state.engine.stats()
    return _json([{"dp_rank": 0, "num_reqs": st.num_running + st.num_waiting,
                   "num_waiting_reqs": st.num_waiting, "num_tokens": st.num_used_tokens}])


async def ready(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(status=200 if state.ready else 503)


async def health(request: web.Request) -> web.Response:
    """Runs a real 1-token generation through the engine, as SGLang does."""
    state = request.app[STATE_KEY]
    if not state.ready:
        return web.Response(status=503)
    rid = "HEALTH_CHECK_" + new_rid()
    try:
        _, ch = state.runtime.submit(rid, 1, 1, "")
    except QueueFull:
        return web.Response(status=503)
    try:
        while True:
            if any(finished for _, finished, _ in await ch.get()):
                break
    finally:
        state.runtime.release(rid)
    return web.Response(status=200)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/server_info", server_info),
        web.get("/get_server_info", server_info),
        web.get("/model_info", model_info),
        web.get("/get_model_info", model_info),
        web.get("/v1/models", models),
        web.get("/v1/loads", loads),
        web.get("/get_load", get_load),
        web.get("/ready", ready),
        web.get("/health", health),
        web.get("/health_generate", health),
    ]
