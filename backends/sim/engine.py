"""The twin's engine: a clock-agnostic model of SGLang's continuous batching.

The same engine runs inside the wall-clock HTTP server (which sleeps each step's duration) and
inside virtual-clock drivers (curves, calibration, the policy evaluator) that add durations to a
counter and push thousands of requests through in seconds. So it is pure and cheap: no asyncio,
no clock reads, no I/O; `step()` returns how long the step *would* take on the real hardware.

One step = admit waiting requests (FCFS, up to `max_running` and the KV budget; their prefill
cost is added to the step and each emits its first token) + one decode/verify pass over the
sequences already running. Step time follows STUDIES.md:

    t(B, w) = t0 + k*(B*w - 1) + k_compute*max(0, B*w - knee) + draft(B)

with B running sequences each verifying w tokens. On speculative profiles each sequence draws
its accepted drafts from a truncated geometric law with a per-request acceptance probability
(domain, per-prompt variation, DDTree budget); it emits accepted drafts + 1 bonus token.
"""

from __future__ import annotations

import collections
import hashlib
import math
import random
from typing import NamedTuple

import msgspec

from backends.sim.domain import classify, prompt_key, prompt_variation
from backends.sim.profile import Profile, SpecConfig

__all__ = [
    "Emission",
    "Engine",
    "EngineStats",
    "QueueFull",
    "SimRequest",
    "SpecDetails",
    "StepResult",
    "effective_accept_prob",
]

MAX_PREFILL_TOKENS = 16384  # SGLang's default --max-prefill-tokens: prompt tokens admitted per step
_STATS_WINDOW = 40  # steps; SGLang refreshes its load gauges about every 40 decode iterations


class QueueFull(Exception):
    """The waiting queue is at `max_queued`: SGLang answers 503."""


class Emission(NamedTuple):
    """Tokens one request produced in one step (all accepted tokens of a verify pass at once)."""

    rid: str
    n_tokens: int
    finished: bool
    finish_reason: str | None


class StepResult(msgspec.Struct, frozen=True):
    """What one step did and how long it takes on the simulated hardware (seconds, unscaled)."""

    duration_s: float
    emissions: list[Emission]
    batch_size: int  # sequences in the decode/verify pass
    verify_width: int
    admitted: int
    prefill_tokens: int


class SpecDetails(msgspec.Struct, frozen=True):
    """SGLang's `spec_tokens_details` / meta_info speculative fields for one finished request."""

    spec_verify_ct: int
    spec_accept_length: float
    spec_accept_rate: float
    spec_num_correct_drafts: int
    spec_num_proposed_drafts: int
    spec_correct_drafts_histogram: list[int]


class EngineStats(msgspec.Struct, frozen=True):
    """Load and speculation gauges, as /v1/loads, /server_info and /metrics report them."""

    num_running: int
    num_waiting: int
    num_used_tokens: int
    token_usage: float
    gen_throughput: float  # tokens per simulated second over the recent window
    accept_length: float  # windowed (tokens per verify pass), 0 without speculation
    accept_rate: float  # windowed correct / proposed drafts
    avg_accept_length: float  # lifetime
    total_verify_ct: int
    total_generated_tokens: int
    total_prompt_tokens: int
    busy_s: float  # simulated seconds spent in steps


class SimRequest:
    """One request inside the engine; its counters become usage and spec details."""

    __slots__ = (
        "rid", "prompt_tokens", "max_new_tokens", "domain", "seed", "accept_p",
        "completion_tokens", "verify_ct", "correct_drafts", "proposed_drafts", "histogram",
        "state", "finish_reason", "_rng", "_logp",
    )

    def __init__(self, rid: str, prompt_tokens: int, max_new_tokens: int, domain: str,
                 seed: int, accept_p: float, max_drafts: int) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.domain = domain
        self.seed = seed
        self.accept_p = accept_p
        self.completion_tokens = 0
        self.verify_ct = 0
        self.correct_drafts = 0
        self.proposed_drafts = 0
        self.histogram = [0] * (max_drafts + 1) if max_drafts else []
        self.state = "waiting"  # waiting | running | finished | aborted
        self.finish_reason: str | None = None
        self._rng = random.Random(seed)
        self._logp = math.log(accept_p) if accept_p > 0 else -math.inf

    @property
    def accept_length(self) -> float:
        """SGLang's definition: completion tokens / verify passes (bonus token included)."""
        return self.completion_tokens / self.verify_ct if self.verify_ct else 0.0

    def spec_details(self) -> SpecDetails | None:
        """Speculative stats as SGLang reports them; None without any verify pass."""
        if not self.verify_ct:
            return None
        rate = self.correct_drafts / self.proposed_drafts if self.proposed_drafts else 0.0
        return SpecDetails(self.verify_ct, self.accept_length, rate, self.correct_drafts,
                           self.proposed_drafts, list(self.histogram))


def effective_accept_prob(spec: SpecConfig, max_depth: int, p_chain: float) -> float:
    """Per-depth acceptance of a draft tree built from a chain drafter with acceptance p_chain.

    DDTree spends `budget` nodes over at most `max_depth` levels; the extra siblings catch some
    misses, shrinking the per-depth miss rate by (depth / budget)**gamma. On hybrid targets,
    budgets above `exact_budget` corrupt recurrent state and lose acceptance exponentially.
    """
    if spec.algorithm != "DDTREE" or not spec.ddtree_budget:
        return p_chain
    budget = spec.ddtree_budget
    p = p_chain
    if budget > max_depth > 0:
        p = 1.0 - (1.0 - p_chain) * (max_depth / budget) ** spec.tree_gamma
    if spec.exact_budget is not None and budget > spec.exact_budget:
        p *= math.exp(-spec.collapse_per_node * (budget - spec.exact_budget))
    return p


def _seed_of(*parts: int | str) -> int:
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class Engine:
    """Continuous batching over one simulated server. Not thread-safe; one driver at a time."""

    def __init__(self, profile: Profile, seed: int = 0, max_running: int | None = None,
                 max_queued: int | None = None) -> None:
        self.profile = profile
        self.seed = seed
        self.max_running = max_running or profile.max_running_requests
        self.max_queued = max_queued
        self.accept_scale = 1.0  # fault knob: acceptance multiplied by this (1.0 = nominal)
        self._width = profile.verify_width
        self._max_drafts = profile.max_accept_drafts
        self._proposed_per_verify = self._width - 1
        self._waiting: collections.deque[SimRequest] = collections.deque()
        self._running: list[SimRequest] = []
        self._by_rid: dict[str, SimRequest] = {}
        self._occurrences: dict[int, int] = {}
        self._window: collections.deque[tuple[float, int, int, int, int]] = collections.deque(
            maxlen=_STATS_WINDOW)
        self._total_verify_ct = 0
        self._total_verify_tokens = 0
        self._total_generated = 0
        self._total_prompt = 0
        self._busy_s = 0.0
        st = profile.step
        self._t0 = st.t0_ms / 1000.0
        self._k = st.k_ms / 1000.0
        self._knee = st.knee_tokens
        self._kc = st.k_compute_ms / 1000.0
        self._draft0 = st.draft_ms / 1000.0 if profile.is_speculative else 0.0
        self._draft1 = st.draft_ms_per_seq / 1000.0 if profile.is_speculative else 0.0
        self._tree = st.tree_ms_per_node / 1000.0 if profile.is_speculative else 0.0
        self._pf0 = st.prefill_ms_base / 1000.0
        self._pf1 = st.prefill_ms_per_token / 1000.0

    # ----------------------------------------------------------------- cost model

    def step_time(self, batch: int, width: int | None = None) -> float:
        """Seconds of one decode/verify pass over `batch` sequences verifying `width` tokens."""
        if batch <= 0:
            return 0.0
        w = self._width if width is None else width
        n = batch * w
        t = self._t0 + self._k * (n - 1)
        if n > self._knee:
            t += self._kc * (n - self._knee)
        if self._draft0 or self._draft1 or self._tree:
            t += self._draft0 + self._draft1 * (batch - 1) + self._tree * batch * (w - 1)
        return t

    def prefill_time(self, prompt_tokens: int, batch: int = 0) -> float:
        """Seconds to prefill admitted prompts totalling `prompt_tokens`.

        Alone (batch 0) a prefill pays a whole forward pass (`prefill_ms_base`, latency-bound like
        a decode step); next to a running batch it rides along the decode pass (SGLang's mixed
        chunked prefill) and costs only its tokens. This keeps TTFT realistic on an idle server
        without charging a full extra forward each time a closed-loop client starts a request.
        """
        return (self._pf0 if batch == 0 else 0.0) + self._pf1 * prompt_tokens

    def accept_prob(self, domain: str, key: int = 0) -> float:
        """Per-depth acceptance probability of a prompt of `domain` with prompt hash `key`."""
        acc = self.profile.acceptance
        spec = self.profile.speculative
        if acc is None or spec is None:
            return 0.0
        # Per-prompt variation scales the miss rate (1 - p) by exp(+-spread): uniform in effect
        # whether p is 0.75 or 0.99, and p never leaves (0, 1).
        miss = (1.0 - getattr(acc, domain)) * math.exp(acc.prompt_spread * prompt_variation(key))
        p = effective_accept_prob(spec, self._max_drafts, min(max(1.0 - miss, 0.0), 0.999))
        return min(max(p, 0.0), 0.999)

    # ------------------------------------------------------------------- requests

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    def get(self, rid: str) -> SimRequest | None:
        return self._by_rid.get(rid)

    def submit(self, rid: str, prompt_tokens: int, max_new_tokens: int, prompt_text: str = "",
               domain: str | None = None) -> SimRequest:
        """Queue a request. The domain is read from `prompt_text` unless given.

        Raises QueueFull when `max_queued` requests already wait, ValueError on a duplicate rid.
        """
        if rid in self._by_rid:
            raise ValueError(f"duplicate request id {rid}")
        if self.max_queued is not None and len(self._waiting) >= self.max_queued:
            raise QueueFull("The request queue is full.")
        key = prompt_key(prompt_text) if prompt_text else 0
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        dom = domain or (classify(prompt_text) if prompt_text else "chat")
        req = SimRequest(rid, max(1, prompt_tokens), max(1, max_new_tokens), dom,
                         _seed_of(self.seed, key, occurrence), self.accept_prob(dom, key),
                         self._max_drafts)
        self._waiting.append(req)
        self._by_rid[rid] = req
        return req

    def abort(self, rid: str) -> SimRequest | None:
        """Drop a waiting or running request and free its slot; None if unknown or done."""
        req = self._by_rid.pop(rid, None)
        if req is None:
            return None
        if req.state == "waiting":
            self._waiting.remove(req)
        elif req.state == "running":
            self._running.remove(req)
        req.state = "aborted"
        req.finish_reason = "abort"
        return req

    # ----------------------------------------------------------------------- step

    def _admit(self) -> list[SimRequest]:
        admitted: list[SimRequest] = []
        room = self.max_running - len(self._running)
        kv_free = self.profile.max_total_num_tokens - self._used_tokens()
        budget = MAX_PREFILL_TOKENS
        while self._waiting and room > 0:
            req = self._waiting[0]
            need = req.prompt_tokens + req.max_new_tokens
            if admitted and (req.prompt_tokens > budget or need > kv_free):
                break
            if not admitted and need > kv_free and self._running:
                break  # wait for running requests to free KV
            self._waiting.popleft()
            req.state = "running"
            admitted.append(req)
            room -= 1
            kv_free -= need
            budget -= req.prompt_tokens
        return admitted

    def step(self) -> StepResult:
        """Run one engine iteration; an idle engine returns a zero-length empty step."""
        decode = self._running
        admitted = self._admit() if self._waiting else []
        batch = len(decode)
        duration = self.step_time(batch)
        prefill_tokens = 0
        if admitted:
            prefill_tokens = sum(r.prompt_tokens for r in admitted)
            duration += self.prefill_time(prefill_tokens, batch)
            self._total_prompt += prefill_tokens
        emissions: list[Emission] = []
        still: list[SimRequest] = []
        generated = 0
        verify_tokens = 0
        correct = 0
        spec = self._max_drafts > 0
        if spec and batch:
            log_scale = math.log(self.accept_scale) if self.accept_scale > 0 else -math.inf
            m = self._max_drafts
            proposed = self._proposed_per_verify
            for r in decode:
                u = r._rng.random()
                logp = r._logp + log_scale
                if u <= 0.0:
                    a = m
                elif logp == -math.inf:
                    a = 0
                else:
                    a = int(math.log(u) / logp)
                    if a > m:
                        a = m
                r.verify_ct += 1
                r.histogram[a] += 1
                r.correct_drafts += a
                r.proposed_drafts += proposed
                correct += a
                n = a + 1
                left = r.max_new_tokens - r.completion_tokens
                if n >= left:
                    n = left
                verify_tokens += n
                generated += n
                r.completion_tokens += n
                if r.completion_tokens >= r.max_new_tokens:
                    self._finish(r, emissions, n)
                else:
                    emissions.append(Emission(r.rid, n, False, None))
                    still.append(r)
        else:
            for r in decode:
                r.completion_tokens += 1
                generated += 1
                if r.completion_tokens >= r.max_new_tokens:
                    self._finish(r, emissions, 1)
                else:
                    emissions.append(Emission(r.rid, 1, False, None))
                    still.append(r)
        for r in admitted:
            r.completion_tokens = 1
            generated += 1
            if r.max_new_tokens <= 1:
                self._finish(r, emissions, 1)
            else:
                emissions.append(Emission(r.rid, 1, False, None))
                still.append(r)
        self._running = still
        verifies = batch if spec else 0
        self._total_verify_ct += verifies
        self._total_verify_tokens += verify_tokens
        self._total_generated += generated
        self._busy_s += duration
        if batch or admitted:
            self._window.append((duration, generated, verify_tokens, verifies, correct))
        return StepResult(duration, emissions, batch, self._width, len(admitted), prefill_tokens)

    def _finish(self, r: SimRequest, emissions: list[Emission], n: int) -> None:
        r.state = "finished"
        r.finish_reason = "length"
        del self._by_rid[r.rid]
        emissions.append(Emission(r.rid, n, True, "length"))

    # ---------------------------------------------------------------------- stats

    def _used_tokens(self) -> int:
        return sum(r.prompt_tokens + r.completion_tokens for r in self._running)

    def stats(self) -> EngineStats:
        """Current gauges; windowed figures cover the last ~40 busy steps."""
        used = self._used_tokens()
        dur = sum(w[0] for w in self._window)
        gen = sum(w[1] for w in self._window)
        vtok = sum(w[2] for w in self._window)
        vct = sum(w[3] for w in self._window)
        corr = sum(w[4] for w in self._window)
        proposed = vct * self._proposed_per_verify
        lifetime = (self._total_verify_tokens / self._total_verify_ct
                    if self._total_verify_ct else 0.0)
        return EngineStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_used_tokens=used,
            token_usage=used / self.profile.max_total_num_tokens,
            gen_throughput=gen / dur if dur > 0 else 0.0,
            accept_length=vtok / vct if vct else 0.0,
            accept_rate=corr / proposed if proposed else 0.0,
            avg_accept_length=lifetime,
            total_verify_ct=self._total_verify_ct,
            total_generated_tokens=self._total_generated,
            total_prompt_tokens=self._total_prompt,
            busy_s=self._busy_s,
        )
