"""`specroute backends check URL`: probe a live SGLang server the way the gateway's poller does.

It reads `/server_info` (fallback `/get_server_info`), the model card's context length
(`/v1/models`), readiness (`/ready`, fallback `/health`), SGLang's engine check
(`/health_generate`), load (`/v1/loads`, fallbacks `/get_load` then `/metrics`) with the parsers
of `backends.loads`,
then runs one short generation with `return_spec_tokens_details` and computes the acceptance
length as `completion_tokens / spec_verify_ct`. Servers too old for the flag are measured through
native `/generate` (its `meta_info`), which the gateway itself does not read: the report says so.
These reads are synchronous urllib: a one-shot command. Last, the start-up measurement the gateway
takes of each backend (`backends.measure`, on the gateway's own client): the figures it would seed
its policy with.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import msgspec

from backends import BackendSpec
from backends.client import SGLangClient
from backends.loads import LoadReport, parse_get_load, parse_loads, parse_metrics, parse_model_cards, parse_server_info
from backends.measure import Measurement, MeasurementFailed, measure
from tools.fit.algorithms import classify, verify_width

__all__ = ["Generation", "ProbeReport", "probe", "render"]

PROMPT = "Count from 1 to 30, separated by commas."


class Generation(msgspec.Struct, kw_only=True):
    route: str
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    accept_length: float | None = None
    source: str | None = None  # where spec_verify_ct came from
    seconds: float | None = None
    error: str | None = None


class ProbeReport(msgspec.Struct, kw_only=True):
    url: str
    reachable: bool = False
    ready: bool | None = None
    ready_path: str | None = None
    engine_check: int | None = None  # /health_generate's status (None: no answer within the timeout)
    engine_check_s: float | None = None
    max_model_len: int | None = None  # the context length, from /v1/models
    adapters: list[str] = []  # LoRA adapters loaded, from /v1/models
    server_info_path: str | None = None
    version: str | None = None
    served_model_name: str | None = None
    algorithm: str | None = None
    strategy: str | None = None
    max_running_requests: int | None = None
    tp_size: int | None = None
    attention_backend: str | None = None
    draft_model_path: str | None = None
    verify_width: int | None = None
    lifetime_accept_length: float | None = None
    load_path: str | None = None
    load: LoadReport | None = None
    generation: Generation | None = None
    gateway_per_request_accept: bool = False
    startup: Measurement | None = None  # what the gateway's start-up measurement gets (`backends.measure`)
    startup_error: str | None = None  # why it could not be taken: the gateway keeps the backend's prior
    fallbacks: list[str] = []
    problems: list[str] = []

    @property
    def ok(self) -> bool:
        return (
            self.reachable
            and self.server_info_path is not None
            and self.generation is not None
            and self.generation.error is None
        )


class _Http:
    def __init__(self, base: str, api_key: str | None, timeout_s: float) -> None:
        self.base = base.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s

    def request(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, **({"Content-Type": "application/json"} if data is not None else {})}
        req = urllib.request.Request(
            self.base + path, data=data, headers=headers, method="POST" if data is not None else "GET"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        status, raw = self.request(path, body)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None


def _server_info(http: _Http, report: ProbeReport) -> None:
    for path in ("/server_info", "/get_server_info"):
        status, data = http.json(path)
        if status == 200 and isinstance(data, dict):
            report.server_info_path = path
            if path != "/server_info":
                report.fallbacks.append("/get_server_info (no /server_info)")
            info = parse_server_info(data)
            if info is None:
                break
            report.version = info.version
            report.served_model_name = info.served_model_name
            report.algorithm = info.speculative_algorithm
            report.max_running_requests = info.max_running_requests
            report.lifetime_accept_length = info.avg_spec_accept_length
            tp = data.get("tp_size")
            report.tp_size = tp if isinstance(tp, int) else None
            backend = data.get("attention_backend")
            report.attention_backend = backend if isinstance(backend, str) else None
            draft = data.get("speculative_draft_model_path")
            report.draft_model_path = draft if isinstance(draft, str) else None
            report.verify_width = verify_width(data)
            kind = classify(info.speculative_algorithm)
            report.strategy = kind.strategy
            if report.strategy is None:
                report.problems.append(f"speculative_algorithm {info.speculative_algorithm}: {kind.why}")
            return
    report.problems.append(
        "neither /server_info nor /get_server_info answered with JSON: the gateway will not "
        "know the algorithm or the cap"
    )


def _ready(http: _Http, report: ProbeReport) -> None:
    status, _ = http.request("/ready")
    report.ready_path = "/ready"
    if status == 404:
        report.fallbacks.append("/health for readiness (no /ready)")
        report.ready_path = "/health"
        status, _ = http.request("/health")
    report.ready = status == 200
    if not report.ready:
        report.problems.append(f"{report.ready_path} answered {status}: the gateway keeps the backend out of the pool")


def _engine_check(http: _Http, report: ProbeReport) -> None:
    """SGLang's own check that the engine steps, as the gateway's poller runs it."""
    t0 = time.perf_counter()
    try:
        status, _ = http.request("/health_generate")
    except TimeoutError:
        report.problems.append("/health_generate gave no answer: the engine looks hung")
        return
    report.engine_check, report.engine_check_s = status, time.perf_counter() - t0
    if status == 404:
        report.fallbacks.append("no engine check (no /health_generate): a hung engine is noticed by timeouts only")
    elif status != 200:
        report.problems.append(
            f"/health_generate answered {status}: no batch finished within SGLang's timeout (or starting up);"
            " the gateway keeps the backend out of the pool"
        )


def _model_cards(http: _Http, report: ProbeReport) -> None:
    status, data = http.json("/v1/models")
    cards = parse_model_cards(data, report.served_model_name) if status == 200 else None
    if cards is not None:
        report.max_model_len, report.adapters = cards.max_model_len, sorted(cards.adapters)


def _load(http: _Http, report: ProbeReport) -> None:
    for path, label in (
        ("/v1/loads?include=core,spec", "/v1/loads"),
        ("/get_load", "/get_load"),
        ("/metrics", "/metrics"),
    ):
        status, raw = http.request(path)
        if status == 404:
            continue
        if status != 200:
            report.problems.append(f"{label} answered {status}")
            return
        if label == "/metrics":
            load = parse_metrics(raw.decode("utf-8", "replace"))
        else:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            load = parse_loads(data) if label == "/v1/loads" else parse_get_load(data)
        if label != "/v1/loads":
            report.fallbacks.append(f"{label} for load (no /v1/loads)")
        report.load_path, report.load = label, load
        if load is None:
            report.problems.append(f"{label} answered but could not be parsed")
        return
    report.problems.append(
        "no load endpoint (/v1/loads, /get_load, /metrics without --enable-metrics): the gateway "
        "counts only its own in-flight for this backend"
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _generate(http: _Http, report: ProbeReport, max_tokens: int) -> None:
    model = report.served_model_name or "default"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
        "return_spec_tokens_details": True,
    }
    t0 = time.perf_counter()
    status, data = http.json("/v1/chat/completions", body)
    gen = Generation(route="/v1/chat/completions", seconds=round(time.perf_counter() - t0, 3))
    if status != 200 or not isinstance(data, dict):
        gen.error = f"HTTP {status}: {json.dumps(data)[:200] if data is not None else 'no JSON body'}"
        report.generation = gen
        report.problems.append(f"/v1/chat/completions failed: {gen.error}")
        return
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    gen.completion_tokens = _int(usage.get("completion_tokens"))
    details = (data.get("sglext") or {}).get("spec_tokens_details") if isinstance(data.get("sglext"), dict) else None
    if isinstance(details, list):
        details = details[0] if details else None
    if isinstance(details, dict) and _int(details.get("spec_verify_ct")):
        gen.spec_verify_ct = details["spec_verify_ct"]
        gen.source = "sglext.spec_tokens_details"
        report.gateway_per_request_accept = True
    report.generation = gen
    if report.algorithm and gen.spec_verify_ct is None:
        report.fallbacks.append("native /generate meta_info for accept length (no return_spec_tokens_details)")
        native = {"text": PROMPT, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
        t0 = time.perf_counter()
        status, data = http.json("/generate", native)
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if status == 200 and isinstance(meta, dict) and _int(meta.get("spec_verify_ct")):
            report.generation = Generation(
                route="/generate",
                completion_tokens=_int(meta.get("completion_tokens")),
                spec_verify_ct=meta["spec_verify_ct"],
                source="meta_info",
                seconds=round(time.perf_counter() - t0, 3),
            )
        else:
            report.problems.append("no per-request speculative stats on /v1/chat/completions nor /generate")
    gen = report.generation
    if gen.completion_tokens and gen.spec_verify_ct:
        gen.accept_length = round(gen.completion_tokens / gen.spec_verify_ct, 3)


def _startup(report: ProbeReport, api_key: str | None, timeout_s: float) -> None:
    """The gateway's start-up measurement of this backend, by the gateway's own code and client."""
    spec = BackendSpec(name="check", url=report.url, model=report.served_model_name or "default", api_key=api_key)

    async def run() -> Measurement:
        client = SGLangClient(spec, connections=1)
        try:
            return await measure(client, speculative=report.algorithm is not None, timeout_s=timeout_s)
        finally:
            await client.close()

    try:
        report.startup = asyncio.run(run())
    except (MeasurementFailed, aiohttp.ClientError, OSError, ValueError) as e:
        report.startup_error = str(e) or type(e).__name__
        return
    report.problems += [f"start-up measurement: {p} (the gateway ignores it)" for p in report.startup.problems()]


def probe(url: str, *, api_key: str | None = None, max_tokens: int = 32, timeout_s: float = 30.0) -> ProbeReport:
    report = ProbeReport(url=url.rstrip("/"))
    http = _Http(url, api_key, timeout_s)
    try:
        _server_info(http, report)
        report.reachable = True
        _model_cards(http, report)
        _ready(http, report)
        _engine_check(http, report)
        _load(http, report)
        if report.ready:
            _generate(http, report, max_tokens)
            _startup(report, api_key, timeout_s)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        reason = getattr(e, "reason", e)
        report.problems.append(f"{url}: unreachable ({reason})")
    return report


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}{suffix}"
    return f"{value}{suffix}"


def _startup_row(report: ProbeReport) -> str:
    m = report.startup
    if m is None:
        return f"not taken ({report.startup_error or 'not ready'}): the gateway starts from its strategy prior"
    parts = [f"step {_fmt(None if m.step_s is None else m.step_s * 1000, ' ms')}"]
    if m.accept_length:
        parts.append("accept " + " ".join(f"{d} {a:.2f}" for d, a in m.accept_length.items()))
    per_1k = None if m.prefill_per_token_s is None else m.prefill_per_token_s * 1e6
    parts.append(f"prefill {_fmt(per_1k, ' ms/1k tokens')}")
    return ", ".join(parts) + "   (seeds the policy when its pool mixes strategies)"


def render(report: ProbeReport) -> str:
    """The report as aligned `key  value` lines: what the gateway will see for this backend."""
    rows: list[tuple[str, str]] = [("backend", report.url)]
    if not report.reachable:
        rows.append(("status", "unreachable"))
    else:
        rows += [
            ("sglang version", _fmt(report.version)),
            ("server info", _fmt(report.server_info_path)),
            ("served model", _fmt(report.served_model_name) + "   (the gateway rewrites `model` to this name)"),
            (
                "algorithm",
                (report.algorithm or "none (autoregressive)")
                + (f"   -> strategy {report.strategy}" if report.strategy else ""),
            ),
            ("verify width", _fmt(report.verify_width, " tokens per step")),
            ("draft model", _fmt(report.draft_model_path)),
            ("tp size", _fmt(report.tp_size)),
            ("attention", _fmt(report.attention_backend)),
            (
                "cap",
                f"max_running_requests {_fmt(report.max_running_requests)}"
                + (
                    "   (the gateway's per-backend in-flight cap)"
                    if report.max_running_requests
                    else "   (unknown: no per-backend cap)"
                ),
            ),
            ("context length", _fmt(report.max_model_len, " tokens (/v1/models max_model_len)")),
            ("lora adapters", ", ".join(report.adapters) if report.adapters else "none"),
            ("ready", f"{_fmt(report.ready_path)} {'200' if report.ready else 'not ready'}"),
            (
                "engine check",
                f"/health_generate {_fmt(report.engine_check)} in {_fmt(report.engine_check_s, ' s')}"
                if report.engine_check is not None
                else "no answer",
            ),
        ]
        load = report.load
        if load is not None:
            parts = [f"running {_fmt(load.running)}", f"waiting {_fmt(load.waiting)}"]
            if load.max_running is not None:
                parts.append(f"cap {load.max_running}")
            if load.accept_length is not None:
                parts.append(f"accept length {load.accept_length:.2f}")
            if load.token_load is not None:
                parts.append(f"token load {load.token_load}")
            rows.append(("load", f"{report.load_path}: " + ", ".join(parts)))
        else:
            rows.append(("load", "none"))
        if report.lifetime_accept_length:
            rows.append(("lifetime accept", f"{report.lifetime_accept_length:.2f} (server_info internal_states)"))
        gen = report.generation
        if gen is not None:
            if gen.error:
                rows.append(("generation", f"{gen.route}: {gen.error}"))
            else:
                text = f"{gen.route}: {_fmt(gen.completion_tokens)} tokens in {_fmt(gen.seconds, ' s')}"
                if gen.spec_verify_ct:
                    text += (
                        f", {gen.spec_verify_ct} verify steps -> accept length {_fmt(gen.accept_length)}"
                        f" (completion_tokens / spec_verify_ct, from {gen.source})"
                    )
                rows.append(("generation", text))
        rows.append(("start-up measure", _startup_row(report)))
        if report.algorithm:
            if report.gateway_per_request_accept:
                text = "yes: the gateway reads sglext.spec_tokens_details of every finished request"
            elif load is not None and load.accept_length is not None:
                text = f"no: the gateway uses the accept length {report.load_path} reports, and its priors"
            else:
                text = "no: no accept length reaches the gateway from this server; it routes on its priors"
            rows.append(("per-request accept", text))
        rows.append(("fallbacks", "; ".join(report.fallbacks) if report.fallbacks else "none"))
    for problem in report.problems:
        rows.append(("problem", problem))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
