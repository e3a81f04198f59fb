"""Closed-loop load over real HTTP against twin processes, reported in simulated seconds.

Calibration uses this to check that the wall-clock server reproduces what the engine computes
on a virtual clock (step loop, streaming, scheduling overhead included). It spawns one
`python -m twin` per profile with `--time-scale`, and divides measured wall times by that
scale. It has the same `level(...)` signature as `EngineDriver`, so a driver built on the
`loadgen` CLI can replace it without touching calibration.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

from common.keep_alive import CLIENT_KEEP_ALIVE_S
from tools.processes import ProcessError, free_port, spawn, stop, wait_ready
from twin.virtual import DEFAULT_PROMPTS, LevelResult

__all__ = ["HttpDriver", "TwinProcess"]


class TwinProcess:
    """One `python -m twin` subprocess on a free loopback port; its output in a temporary log."""

    def __init__(self, profile: str, time_scale: float, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, log = tempfile.mkstemp(prefix=f"twin-{profile}-", suffix=".log")
        os.close(fd)
        self.log = Path(log)
        cmd = [
            sys.executable,
            "-m",
            "twin",
            "--profile",
            profile,
            "--port",
            str(self.port),
            "--time-scale",
            str(time_scale),
            *extra,
        ]
        self.proc = spawn(cmd, log_file=self.log)
        try:
            wait_ready(f"{self.url}/ready", proc=self.proc, timeout_s=30.0, name=f"twin {profile}", log_file=self.log)
        except ProcessError:
            stop(self.proc)  # its log stays, named in the error
            raise

    def stop(self) -> None:
        stop(self.proc)
        self.log.unlink(missing_ok=True)


class _Record(msgspec.Struct):
    start: float
    first: float = 0.0
    last: float = 0.0
    chunks: int = 0
    completion_tokens: int = 0
    verify_ct: int = 0


_decode = msgspec.json.Decoder().decode


async def _one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> _Record:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "return_spec_tokens_details": True,
        # the studies' benchmarks decode greedily; SGLang's default would be 1.0
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    rec = _Record(start=time.perf_counter())
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.perf_counter()
            obj = _decode(line[6:])
            choices = obj.get("choices")
            if choices:
                if choices[0].get("delta", {}).get("content"):
                    rec.chunks += 1
                    rec.first = rec.first or now
                    rec.last = now
            elif obj.get("usage"):
                rec.completion_tokens = obj["usage"]["completion_tokens"]
            elif obj.get("sglext"):
                rec.verify_ct = obj["sglext"]["spec_tokens_details"]["spec_verify_ct"]
    return rec


async def _closed_loop(
    url: str, concurrency: int, num_requests: int, max_tokens: int, prompts: tuple[str, ...]
) -> tuple[list[_Record], float]:
    issued = 0
    records: list[_Record] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal issued
        while issued < num_requests:
            i = issued
            issued += 1
            records.append(await _one(session, url, prompts[i % len(prompts)], max_tokens))

    conn = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=CLIENT_KEEP_ALIVE_S)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return records, time.perf_counter() - t0


class HttpDriver:
    """Measures closed-loop levels against twin processes; use as a context manager."""

    source = "http"

    def __init__(self, time_scale: float = 0.1) -> None:
        self.time_scale = time_scale
        self._twins: dict[str, TwinProcess] = {}

    def __enter__(self) -> HttpDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        for twin in self._twins.values():
            twin.stop()
        self._twins.clear()

    def _twin(self, profile: str) -> TwinProcess:
        if profile not in self._twins:
            self._twins[profile] = TwinProcess(profile, self.time_scale)
        return self._twins[profile]

    def level(
        self, profile: str, concurrency: int, num_requests: int, max_tokens: int, domain: str | None = None
    ) -> LevelResult:
        prompts = DEFAULT_PROMPTS[domain] if domain else tuple(p for g in DEFAULT_PROMPTS.values() for p in g)
        url = self._twin(profile).url
        records, wall = asyncio.run(_closed_loop(url, concurrency, num_requests, max_tokens, prompts))
        s = self.time_scale
        n = len(records)
        e2e = [(r.last - r.start) / s for r in records]
        total = sum(r.completion_tokens for r in records)
        steps = [((r.last - r.first) / s) / (r.chunks - 1) for r in records if r.chunks > 1]
        acc = [r.completion_tokens / r.verify_ct for r in records if r.verify_ct]
        return LevelResult(
            concurrency=concurrency,
            completed=n,
            duration_s=wall / s,
            total_output_tokens=total,
            output_throughput=total / (wall / s),
            mean_request_output_throughput=sum(r.completion_tokens / t for r, t in zip(records, e2e, strict=True)) / n,
            mean_ttft_s=sum((r.first - r.start) / s for r in records) / n,
            mean_e2e_s=sum(e2e) / n,
            accept_length=sum(acc) / len(acc) if acc else 0.0,
            mean_step_s=sum(steps) / len(steps) if steps else 0.0,
        )
