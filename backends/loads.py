"""Parsing what an SGLang server reports about itself: `/server_info`, `/v1/loads` and fallbacks.

SGLang 0.5.23 serves `GET /v1/loads` (per-DP-rank `num_running_reqs`, `num_waiting_reqs`,
`max_running_requests`, `max_total_num_tokens`, `decode_moments`, and `speculative.accept_length`).
Older 0.5.x releases only have `/get_load` (request counts in 0.5.9, only a token load in 0.5.2) and,
under `--enable-metrics`, Prometheus gauges named `sglang:num_running_reqs` (some builds
`sglang_num_running_reqs`). All parsers here are total: malformed input gives None, never an exception.

Acceptance comes in two kinds, and only one is what a router wants (backends/acceptance_window.py):
`/v1/loads` `speculative.accept_length` is the server's LIFETIME average (accepted tokens / verify
passes since start, refreshed every 40 decode steps, absent before the first refresh and on AR:
`managers/scheduler_components/load_inquirer.py`, `metrics_reporter.py`), so `LoadReport` keeps it
apart as `lifetime_accept_length`. `LoadReport.accept_length` is a WINDOWED figure: the `/metrics`
gauge `sglang:spec_accept_length` (the last 40-step interval's), or what the poller derives.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    running: int | None = None
    waiting: int | None = None
    max_running: int | None = None
    max_total_tokens: int | None = None  # KV budget in tokens (`max_total_num_tokens`, summed over ranks)
    accept_length: float | None = None  # windowed (see the module docstring); None when not known
    accept_source: str | None = None  # where `accept_length` came from
    lifetime_accept_length: float | None = None  # `speculative.accept_length` as /v1/loads reports it
    # `decode_moments` (0.5.23, summed over ranks): decode steps, sum of batch sizes (one verify pass
    # per request and step under speculation), of step times (us), of batch^2, of batch*time, and of
    # tokens generated (accepted drafts plus the bonus token, per request and step):
    # `scheduler.py::_accumulate_decode_moment`, `managers/utils.py::get_num_generated_tokens`.
    decode_moments: tuple[float, ...] | None = None
    # (`total_prefill_busy_us`, `total_prefill_uncached_tokens`), 0.5.23, summed over ranks: time
    # spent in prefill steps and the prompt tokens they computed, since start (`scheduler.py`).
    prefill_counters: tuple[float, float] | None = None
    token_load: int | None = None  # /get_load on older servers: tokens in use + queued prompt tokens
    source: str = "v1/loads"

    def restarted_since(self, previous: LoadReport) -> bool:
        """A lifetime counter (decode steps, computed prompt tokens) is below `previous`'s: the
        server restarted between the two reports (its radix cache is empty)."""
        a, b = previous.decode_moments, self.decode_moments
        if a is not None and b is not None and b[0] < a[0]:
            return True
        p, q = previous.prefill_counters, self.prefill_counters
        return p is not None and q is not None and q[1] < p[1]


class ServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    speculative_algorithm: str | None = None
    max_running_requests: int | None = None
    served_model_name: str | None = None
    avg_spec_accept_length: float | None = None  # lifetime, like /v1/loads
    enable_metrics: bool = False  # the server serves /metrics (with the windowed acceptance gauge)
    version: str | None = None
    # The served model's context length: from `GET /v1/models` (its model card), which /server_info
    # does not carry (its `context_length` is only the --context-length override, null by default).
    max_model_len: int | None = None
    # The order its waiting queue serves `priority` in under --enable-priority-scheduling:
    # "high_first", or "low_first" with --schedule-low-priority-values-first; None when off.
    priority_order: str | None = None


def _num(value: Any, typ: type = int) -> Any:
    """A JSON number as `typ`; None for anything else, NaN and infinities included."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return typ(value)


def parse_loads(data: Any) -> LoadReport | None:
    """`GET /v1/loads`: counts summed over DP ranks; the lifetime accept length averaged over the
    ranks that report one; decode moments summed when every rank has them."""
    loads = data.get("loads") if isinstance(data, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    running = waiting = cap = kv = 0
    accepts: list[float] = []
    moments: list[float] | None = [0.0] * _MOMENTS
    prefill: list[float] | None = [0.0, 0.0]
    for rank in loads:
        if not isinstance(rank, dict):
            return None
        r, w = _num(rank.get("num_running_reqs")), _num(rank.get("num_waiting_reqs"))
        if r is None or w is None:
            return None
        running, waiting = running + r, waiting + w
        cap += _num(rank.get("max_running_requests")) or 0
        kv += _num(rank.get("max_total_num_tokens")) or 0
        spec = rank.get("speculative")
        if isinstance(spec, dict) and (a := _num(spec.get("accept_length"), float)):
            accepts.append(a)
        m = rank.get("decode_moments")
        if (
            moments is not None
            and isinstance(m, list)
            and len(m) >= _MOMENTS
            and all(_num(x, float) is not None for x in m[:_MOMENTS])
        ):
            moments = [t + float(x) for t, x in zip(moments, m[:_MOMENTS], strict=True)]
        else:
            moments = None
        busy = _num(rank.get("total_prefill_busy_us"), float)
        computed = _num(rank.get("total_prefill_uncached_tokens"), float)
        if prefill is not None and busy is not None and computed is not None:
            prefill = [prefill[0] + busy, prefill[1] + computed]
        else:
            prefill = None
    return LoadReport(
        running=running,
        waiting=waiting,
        max_running=cap or None,
        max_total_tokens=kv or None,
        lifetime_accept_length=sum(accepts) / len(accepts) if accepts else None,
        decode_moments=tuple(moments) if moments is not None else None,
        prefill_counters=(prefill[0], prefill[1]) if prefill is not None else None,
    )


_MOMENTS = 6


def parse_get_load(data: Any) -> LoadReport | None:
    """`GET /get_load` of older releases, in both shapes seen in 0.5.x:

    - 0.5.9-style: a list per DP rank of `{dp_rank, num_reqs, num_waiting_reqs, num_tokens, ts_tic}`,
      where `num_reqs` counts running *and* waiting requests;
    - 0.5.2-style: `{"load": N}` (tokens in use plus queued prompt tokens, no request counts).
    """
    items = data if isinstance(data, list) else [data]
    if not items:
        return None
    if all(isinstance(i, dict) and "num_reqs" in i for i in items):
        total = [_num(i.get("num_reqs")) for i in items]
        waiting = [_num(i.get("num_waiting_reqs")) or 0 for i in items]
        if any(t is None for t in total):
            return None
        return LoadReport(
            running=sum(total) - sum(waiting),
            waiting=sum(waiting),
            token_load=sum(_num(i.get("num_tokens")) or 0 for i in items),
            source="get_load",
        )
    tokens = 0
    for item in items:
        load = _num(item.get("load")) if isinstance(item, dict) else None
        if load is None:
            return None
        tokens += load
    return LoadReport(token_load=tokens, source="get_load")


_METRIC_LINE = re.compile(
    r"^sglang[:_](num_running_reqs|num_queue_reqs|spec_accept_length)(\{[^}]*\})?\s+(\S+)", re.MULTILINE
)


def parse_metrics(text: str) -> LoadReport | None:
    """Prometheus text of `/metrics` (needs `--enable-metrics`); gauges summed over label sets, the
    acceptance gauge (windowed: the last 40 decode steps) averaged over them."""
    values: dict[str, list[float]] = {}
    for name, _labels, value in _METRIC_LINE.findall(text):
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):  # the text format allows NaN and +Inf: neither is a count or a length
            values.setdefault(name, []).append(number)
    if "num_running_reqs" not in values:
        return None
    accept = [a for a in values.get("spec_accept_length", []) if a > 0]  # 0 before the first interval, and on AR
    return LoadReport(
        running=int(sum(values["num_running_reqs"])),
        waiting=int(sum(values.get("num_queue_reqs", [0.0]))),
        accept_length=(sum(accept) / len(accept)) if accept else None,
        accept_source="metrics gauge" if accept else None,
        source="metrics",
    )


class ModelCards(msgspec.Struct, frozen=True, kw_only=True):
    """What `GET /v1/models` says about a server: its model's context length and the LoRA
    adapters loaded on it (SGLang lists one card per adapter, `parent` = the served model:
    `entrypoints/http_server.py`, `available_models`)."""

    max_model_len: int | None = None
    adapters: frozenset[str] = frozenset()


def parse_model_cards(data: Any, served_model_name: str | None) -> ModelCards | None:
    """`GET /v1/models`: the served model's card (the first card when the name is unknown) for the
    context length, and the adapters' cards (a `parent`, no `max_model_len`). None: not a list."""
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list):
        return None
    cards = [c for c in cards if isinstance(c, dict)]
    base = [c for c in cards if not c.get("parent")]
    card = next((c for c in base if c.get("id") == served_model_name), base[0] if base else None)
    value = _num(card.get("max_model_len")) if card is not None else None
    adapters = frozenset(c["id"] for c in cards if c.get("parent") and isinstance(c.get("id"), str) and c["id"])
    return ModelCards(max_model_len=value if value is not None and value > 0 else None, adapters=adapters)


def parse_server_info(data: Any) -> ServerInfo | None:
    if not isinstance(data, dict):
        return None
    states = data.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    algo = data.get("speculative_algorithm")
    served = data.get("served_model_name")
    return ServerInfo(
        speculative_algorithm=algo if isinstance(algo, str) and algo else None,
        max_running_requests=_num(data.get("max_running_requests")),
        served_model_name=served if isinstance(served, str) else None,
        avg_spec_accept_length=_num(first.get("avg_spec_accept_length"), float),
        enable_metrics=data.get("enable_metrics") is True,
        version=data.get("version") if isinstance(data.get("version"), str) else None,
        priority_order=(
            ("low_first" if data.get("schedule_low_priority_values_first") is True else "high_first")
            if data.get("enable_priority_scheduling") is True
            else None
        ),
    )
