"""The twin's engine: a clock-agnostic model of SGLang's continuous batching.

The same engine runs inside the wall-clock HTTP server (which sleeps each step's duration) and
inside virtual-clock drivers (curves, calibration, the policy evaluator) that add durations to a
counter and push thousands of requests through in seconds. So it is pure and cheap: no asyncio,
no clock reads, no I/O; `step()` returns how long the step *would* take on the real hardware, and
its cost is O(batch) plus O(blocks) of the prompts it admits.

One step = prefill (continue the chunked prompt, then admit waiting requests FCFS up to
`max_running`, the KV budget and MAX_PREFILL_TOKENS new prompt tokens; a prompt that does not fit
is chunked over several steps, as SGLang's chunked prefill does) + one decode/verify pass over
the sequences already running. A request's first token comes out of its last prefill chunk.
Step time follows docs/studies.md:

    t(B, w) = t0 + k*(B*w - 1) + k_compute*max(0, B*w - knee) + draft(B) + kv_read(KV tokens)

with B running sequences each verifying w tokens. On speculative profiles each sequence draws
its accepted drafts from a truncated geometric law with a per-request acceptance probability
(domain, per-prompt variation, DDTree budget, temperature, context beyond the draft window); it
emits accepted drafts + 1 bonus token.

Prefix cache (`prefix_cache.py`). `submit(..., prefix_blocks=chain)` describes the prompt as a
hash chain of PREFIX_BLOCK_TOKENS-token blocks. At admission the longest cached prefix is matched
(those tokens skip prefill; at least one prompt token is always prefilled, as in SGLang) and the
chain is inserted. Multi-turn reuse: when a request finishes, its driver calls
`cache_output(chain)` with the chain of prompt + output (what SGLang's `cache_finished_req` puts in
the radix tree), so the next turn of the conversation, whose prompt starts with that text, hits.
The cache holds at most the KV pool minus what running requests pin outside it; LRU eviction.

Request priority (`Engine(priority=PriorityOptions(...))`, SGLang's `--enable-priority-scheduling`
and its companions). Off (the default) the waiting queue is the plain FCFS deque. On, it is kept
sorted on insertion (`WaitingByPriority`, as `schedule_policy.py: _sort_by_priority_and_fcfs` sorts
SGLang's before each admission); a full queue turns away its least-preferred waiter for a strictly
better arrival (`scheduler.py: _abort_on_queued_limit`); and, unless preemption is disabled, a
waiting request better than a running one by more than the threshold retracts it when the batch
is full (`schedule_policy.py: PrefillAdder.preempt_to_schedule`): the retracted request keeps its
output, goes back to the queue and later prefills its prompt and output again. Requests the
engine aborts on its own (evicted, or retracted into a full queue) are collected in `aborted`
with their `abort_message`; the driver tells their clients (SGLang answers them with status 503).
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import itertools
import math
import random
import sys
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import msgspec

from twin.domain import classify, prompt_key, prompt_variation
from twin.ngram import NgramMemory, copy_step_share
from twin.options import PriorityOptions
from twin.prefix_cache import PREFIX_BLOCK_TOKENS, PrefixCache
from twin.profile import Profile, SpecConfig
from twin.sampling import GREEDY_BELOW, context_miss_scale, factor_at, temperature_miss_scale, window_miss_scale

__all__ = [
    "DECODE_LOG_INTERVAL",
    "MAX_PREFILL_TOKENS",
    "PREEMPTED_MESSAGE",
    "PREFIX_BLOCK_TOKENS",
    "PRIORITY_DISABLED_MESSAGE",
    "QUEUE_FULL_MESSAGE",
    "Emission",
    "Engine",
    "EngineStats",
    "QueueFull",
    "RequestAborted",
    "SimRequest",
    "SpecDetails",
    "StepResult",
    "WaitingByPriority",
    "effective_accept_prob",
    "inverse_tau",
    "tau",
]

MAX_PREFILL_TOKENS = 16384  # SGLang's default --max-prefill-tokens: prompt tokens prefilled per step
# Output tokens a waiting request is counted to need for admission, at most: SGLang's estimate clips
# max_new_tokens there (`schedule_policy.py: CLIP_MAX_NEW_TOKENS`, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION).
CLIP_MAX_NEW_TOKENS = 4096
# SGLang publishes its speculative gauges every `decode_log_interval` (40) decode batches
# (observability/metrics_reporter.py): the windowed figures cover that interval, the lifetime
# average in /v1/loads is refreshed then.
DECODE_LOG_INTERVAL = 40
_THROUGHPUT_WINDOW = 40  # busy steps behind gen_throughput
# Distinct prompts whose repeat count is remembered (a prompt's randomness is seeded by the prompt
# and how many times it came before). Assumption, a memory bound rather than physics: a prompt not
# seen for this many other prompts counts from zero again, as if new.
REMEMBERED_PROMPTS = 65_536


# The messages of SGLang's scheduler aborts (`scheduler.py`), each sent with status 503
QUEUE_FULL_MESSAGE = "The request queue is full."  # `_abort_on_queued_limit`
PREEMPTED_MESSAGE = "The request is aborted by a higher priority request."  # `_abort_on_queued_limit`
PRIORITY_DISABLED_MESSAGE = (  # `_set_or_validate_priority`
    "Using priority is disabled for this server. Please send a new request without a priority."
)


class RequestAborted(Exception):
    """The scheduler refused an arriving request (`scheduler.py: _add_request_to_queue`, status 503);
    the message is SGLang's."""


class QueueFull(RequestAborted):
    """The waiting queue is at `max_queued`: SGLang answers 503."""

    def __init__(self, message: str = QUEUE_FULL_MESSAGE) -> None:
        super().__init__(message)


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
    prefill_tokens: int  # prompt tokens computed this step (cached ones excluded)
    kv_tokens: int = 0  # KV tokens the decode/verify pass read
    cached_tokens: int = 0  # prompt tokens of newly admitted requests served by the cache


class SpecDetails(msgspec.Struct, frozen=True):
    """SGLang's `spec_tokens_details` / meta_info speculative fields for one finished request."""

    spec_verify_ct: int
    spec_accept_length: float
    spec_accept_rate: float
    spec_num_correct_drafts: int
    spec_num_proposed_drafts: int
    spec_correct_drafts_histogram: list[int]


class EngineStats(msgspec.Struct, frozen=True):
    """Load and speculation gauges, as /v1/loads, /server_info and /metrics report them.

    Acceptance comes in SGLang's three forms: `accept_length`/`accept_rate` cover the last
    completed interval of DECODE_LOG_INTERVAL decode steps (the `/metrics` gauges
    `sglang:spec_accept_length`/`_rate`; 0 before the first interval ends); `lifetime_accept_length`
    is the average since start as `/v1/loads` and `/server_info` publish it, refreshed at the end
    of each interval (None before the first refresh and on AR servers); `live_accept_length` is
    the exact lifetime average now (for tests and evaluators, no server reports it).
    """

    num_running: int
    num_waiting: int
    num_used_tokens: int
    token_usage: float
    gen_throughput: float  # tokens per simulated second over the recent window
    accept_length: float
    accept_rate: float
    lifetime_accept_length: float | None
    live_accept_length: float
    total_verify_ct: int
    total_generated_tokens: int
    total_prompt_tokens: int  # prompt tokens computed (cache hits excluded)
    total_cached_tokens: int  # prompt tokens served by the prefix cache
    cache_hit_rate: float  # the last prefill batch's hit rate (SGLang's per-report semantics)
    lifetime_cache_hit_rate: float  # cached / all prompt tokens since start
    cached_blocks_tokens: int  # tokens held by the prefix cache
    busy_s: float  # simulated seconds spent in steps
    # SGLang's `decode_moments` (scheduler.py `_accumulate_decode_moment`): decode steps and the
    # sums of batch size, step time (us), batch^2, batch * time and tokens generated; None before
    # the first decode step. Prefill busy time and computed prompt tokens likewise.
    decode_moments: tuple[float, ...] | None = None
    total_prefill_busy_us: int = 0


class SimRequest:
    """One request inside the engine; its counters become usage and spec details."""

    __slots__ = (
        "rid",
        "prompt_tokens",
        "max_new_tokens",
        "domain",
        "seed",
        "key",
        "accept_p",
        "temperature",
        "top_p",
        "prefix_blocks",
        "limit",
        "limit_reason",
        "cached_tokens",
        "completion_tokens",
        "verify_ct",
        "correct_drafts",
        "proposed_drafts",
        "histogram",
        "state",
        "finish_reason",
        "priority",
        "abort_message",
        "_qkey",
        "copy_steps",
        "copy_logp",
        "remember_key",
        "_rng",
        "_logp",
        "_prefill_left",
        "_prefilled",
        "_outside_cache",
    )

    def __init__(
        self,
        rid: str,
        prompt_tokens: int,
        max_new_tokens: int,
        domain: str,
        seed: int,
        accept_p: float,
        max_drafts: int,
        *,
        key: int = 0,
        temperature: float = 0.0,
        top_p: float = 1.0,
        prefix_blocks: Sequence[int] = (),
        stop_after_tokens: int | None = None,
    ) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.domain = domain
        self.seed = seed
        self.key = key
        self.accept_p = accept_p
        self.temperature = temperature
        self.top_p = top_p
        self.prefix_blocks = prefix_blocks
        del max_drafts  # the histogram grows as needed; kept in the signature for callers
        if stop_after_tokens is not None and stop_after_tokens < max_new_tokens:
            self.limit, self.limit_reason = max(1, stop_after_tokens), "stop"
        else:
            self.limit, self.limit_reason = max_new_tokens, "length"
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.verify_ct = 0
        self.correct_drafts = 0
        self.proposed_drafts = 0
        # SGLang grows it to the largest accepted count seen (schedule_batch.py), not the depth
        self.histogram: list[int] = []
        self.state = "waiting"  # waiting | prefilling | running | finished | aborted
        self.finish_reason: str | None = None
        # the scheduling priority (None: none given and priority scheduling off)
        self.priority: int | None = None
        self.abort_message: str | None = None  # why the engine aborted it on its own (503)
        # admission rank under priority scheduling: (-(sign * priority), -entry); larger goes first
        self._qkey = (0, 0)
        # NGRAM: the share of verify passes spent inside copied text, and their acceptance
        self.copy_steps = 0.0
        self.copy_logp = -math.inf
        self.remember_key = False  # NGRAM: a greedy request, its output repeats for the same prompt
        self._rng = random.Random(seed)
        self._logp = math.log(accept_p) if accept_p > 0 else -math.inf
        self._prefill_left = 0
        self._prefilled = 0  # prompt tokens in KV so far (cached ones included)
        self._outside_cache = 0  # KV tokens this request pins beyond its cached blocks

    @property
    def accept_length(self) -> float:
        """SGLang's definition: completion tokens / verify passes (bonus token included)."""
        return self.completion_tokens / self.verify_ct if self.verify_ct else 0.0

    def spec_details(self) -> SpecDetails | None:
        """Speculative stats as SGLang reports them; None without any verify pass."""
        if not self.verify_ct:
            return None
        rate = self.correct_drafts / self.proposed_drafts if self.proposed_drafts else 0.0
        return SpecDetails(
            self.verify_ct, self.accept_length, rate, self.correct_drafts, self.proposed_drafts, list(self.histogram)
        )


def tau(p: float, depth: int) -> float:
    """Mean tokens per verify pass (accepted drafts + the bonus token) when each of at most
    `depth` drafts is accepted with probability p after its predecessor."""
    if depth <= 0:
        return 1.0
    if p >= 1.0:
        return depth + 1.0
    return (1.0 - p ** (depth + 1)) / (1.0 - p)


def inverse_tau(tokens: float, depth: int) -> float:
    """The per-draft acceptance p with tau(p, depth) == tokens (clamped to [0, 0.999])."""
    if tokens <= 1.0 or depth <= 0:
        return 0.0
    lo, hi = 0.0, 0.999
    if tau(hi, depth) <= tokens:
        return hi
    for _ in range(48):
        mid = (lo + hi) / 2.0
        if tau(mid, depth) < tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def effective_accept_prob(
    spec: SpecConfig, max_depth: int, p_chain: float, temperature: float = 0.0, top_p: float = 1.0
) -> float:
    """Per-depth acceptance of a draft tree built from a chain drafter with acceptance p_chain.

    DDTree's budget beyond the chain's depth buys siblings; the tree then emits (1 + tree_gain)
    times the chain's tokens per verify at T=0, the gain saturating at two siblings (an
    independent vLLM implementation: +3.5..4%, no more from budget 12 to 32). Sampling weakens
    the spine the siblings hang on: at T=1 the tree/chain ratio is multiplied by
    `tree_t1_factor` (linear in T between). On hybrid targets, budgets above `exact_budget`
    corrupt recurrent state and lose acceptance exponentially.
    """
    if spec.algorithm != "DDTREE" or not spec.ddtree_budget:
        return p_chain
    budget = spec.ddtree_budget
    depth = (spec.dflash_block_size or spec.num_draft_tokens) - 1
    p = p_chain
    siblings = budget - depth
    if siblings > 0 or temperature >= GREEDY_BELOW:
        gain = spec.tree_gain * min(1.0, max(0, siblings) / 2.0)
        ratio = (1.0 + gain) * factor_at(spec.tree_t1_factor, temperature, top_p)
        if ratio != 1.0:
            p = inverse_tau(ratio * tau(p_chain, max_depth), max_depth)
    if spec.exact_budget is not None and budget > spec.exact_budget:
        p *= math.exp(-spec.collapse_per_node * (budget - spec.exact_budget))
    return p


def _seed_of(*parts: int | str) -> int:
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class _Interval:
    """Counters of the current decode-log interval (reset when it is published)."""

    __slots__ = ("steps", "accept_tokens", "verify_ct", "correct")

    def __init__(self) -> None:
        self.steps = 0
        self.accept_tokens = 0
        self.verify_ct = 0
        self.correct = 0


def _rank(r: SimRequest) -> tuple[int, int]:
    return r._qkey


class WaitingByPriority:
    """The waiting queue under priority scheduling, in SGLang's admission order: `sign * priority`,
    then the time the request entered the queue (`schedule_policy.py: _sort_by_priority_and_fcfs`;
    sign 1 with `--schedule-low-priority-values-first`, else -1). SGLang sorts its list before each
    admission; keeping it sorted on insertion (bisect) gives the same order. Stored best last, so
    the head pops in O(1) and the least preferred (lowest priority, newest on a tie: the eviction
    candidate of `scheduler.py: _abort_on_queued_limit`) is first. The deque methods the engine
    uses, so the FCFS path keeps its plain deque."""

    __slots__ = ("_items", "_sign", "_entries")

    def __init__(self, low_first: bool) -> None:
        self._items: list[SimRequest] = []
        self._sign = 1 if low_first else -1
        self._entries = itertools.count()  # stands in for `wait_queue_entry_time`

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[SimRequest]:
        return reversed(self._items)

    def __getitem__(self, i: int) -> SimRequest:
        return self._items[-1 - i]

    def append(self, req: SimRequest) -> None:
        """Enqueue; every entry (a retracted request's return too) counts as a new arrival, as
        `_add_request_to_queue` stamps `wait_queue_entry_time` anew."""
        assert req.priority is not None
        req._qkey = (-self._sign * req.priority, -next(self._entries))
        bisect.insort(self._items, req, key=_rank)

    def popleft(self) -> SimRequest:
        return self._items.pop()

    def remove(self, req: SimRequest) -> None:
        self._items.remove(req)

    def worst(self) -> SimRequest:
        return self._items[0]

    def pop_worst(self) -> SimRequest:
        return self._items.pop(0)


class Engine:
    """Continuous batching over one simulated server. Not thread-safe; one driver at a time."""

    def __init__(
        self,
        profile: Profile,
        seed: int = 0,
        max_running: int | None = None,
        max_queued: int | None = None,
        *,
        remembered_prompts: int = REMEMBERED_PROMPTS,
        priority: PriorityOptions | None = None,
    ) -> None:
        if remembered_prompts < 1:
            raise ValueError(f"remembered_prompts must be >= 1, got {remembered_prompts}")
        self.profile = profile
        self.seed = seed
        self.max_running = max_running or profile.max_running_requests
        self.max_queued = max_queued
        self.accept_scale = 1.0  # fault knob: acceptance multiplied by this (1.0 = nominal)
        self.cache = PrefixCache(profile.max_total_num_tokens)
        self._width = profile.verify_width
        self._max_drafts = profile.max_accept_drafts
        self._proposed_per_verify = self._width - 1
        prio = priority or PriorityOptions()
        self.priority = prio
        # Priority scheduling off: a plain FCFS deque, nothing else on the hot path.
        self._ranked = prio.enable_priority_scheduling
        self._waiting: collections.deque[SimRequest] | WaitingByPriority = (
            WaitingByPriority(prio.schedule_low_priority_values_first) if self._ranked else collections.deque()
        )
        self._sign = 1 if prio.schedule_low_priority_values_first else -1
        # `scheduler.py: _set_or_validate_priority`: no priority ranks last in either direction
        self._least_preferred = sys.maxsize if prio.schedule_low_priority_values_first else -sys.maxsize - 1
        self._abort_unranked = not self._ranked and prio.abort_on_priority_when_disabled
        # "preemption is enabled by default for priority scheduling" (`scheduler.py`)
        self._preempt = self._ranked and not prio.disable_priority_preemption
        self._threshold = prio.priority_scheduling_preemption_threshold
        # requests the engine aborted on its own, with `abort_message`; the driver takes them
        self.aborted: list[SimRequest] = []
        self._running: list[SimRequest] = []
        self._chunked: SimRequest | None = None
        self._by_rid: dict[str, SimRequest] = {}
        # prompt key -> times seen, least recently seen first (LRU, as the twin's prefix cache)
        self._occurrences: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._remembered_prompts = remembered_prompts
        self._window: collections.deque[tuple[float, int]] = collections.deque(maxlen=_THROUGHPUT_WINDOW)
        self._interval = _Interval()
        self._published_accept = (0.0, 0.0)  # last interval's (length, rate)
        self._published_total = (0, 0)  # lifetime (accept tokens, verify ct) at the last refresh
        self._kv_running = 0  # KV tokens of the running batch (prompt + output)
        self._kv_chunked = 0  # KV tokens of the request still being prefilled
        self._outside_cache = 0  # running KV not covered by cached blocks
        self._total_verify_ct = 0
        self._total_verify_tokens = 0
        self._total_generated = 0
        self._total_prompt = 0
        self._total_cached = 0
        self._last_hit_rate = 0.0
        self._busy_s = 0.0
        self._moments = [0.0] * 6
        self._prefill_busy_us = 0
        st = profile.step
        self._t0 = st.t0_ms / 1000.0
        self._k = st.k_ms / 1000.0
        self._knee = st.knee_tokens
        self._kc = st.k_compute_ms / 1000.0
        self._draft0 = st.draft_ms / 1000.0 if profile.is_speculative else 0.0
        self._draft1 = st.draft_ms_per_seq / 1000.0 if profile.is_speculative else 0.0
        self._tree = st.tree_ms_per_node / 1000.0 if profile.is_speculative else 0.0
        self._tree0 = st.tree_step_ms / 1000.0 if profile.is_speculative else 0.0
        # without the overlap scheduler the host's share of each step is no longer hidden
        self._exposed = 1.0 + (profile.speculative.no_overlap_loss if profile.speculative else 0.0)
        # NGRAM: what the server's trie still holds of its own output (ngram.py)
        self.ngram_memory = NgramMemory(profile.ngram.horizon_tokens) if profile.ngram is not None else None
        self._pf0 = st.prefill_ms_base / 1000.0
        self._pf1 = st.prefill_ms_per_token / 1000.0
        self._pf_pair = st.prefill_attn_ms_per_mpair / 1e9  # seconds per (query, key) pair
        self._kv_s = st.kv_ns_per_token / 1e9

    # ----------------------------------------------------------------- cost model

    def step_time(self, batch: int, width: int | None = None, kv_tokens: int = 0) -> float:
        """Seconds of one decode/verify pass over `batch` sequences verifying `width` tokens
        that together hold `kv_tokens` tokens of KV cache (read once per step)."""
        if batch <= 0:
            return 0.0
        w = self._width if width is None else width
        n = batch * w
        t = self._t0 + self._k * (n - 1) + self._kv_s * kv_tokens
        if n > self._knee:
            t += self._kc * (n - self._knee)
        if self._draft0 or self._draft1 or self._tree or self._tree0:
            t += self._draft0 + self._draft1 * (batch - 1) + self._tree0 + self._tree * batch * (w - 1)
        return t * self._exposed

    def prefill_time(self, prompt_tokens: int, batch: int = 0, cached_tokens: int = 0) -> float:
        """Seconds to prefill `prompt_tokens` new tokens following `cached_tokens` in KV.

        Alone (batch 0) a prefill pays a whole forward pass (`prefill_ms_base`, latency-bound like
        a decode step); next to a running batch it rides along the decode pass (SGLang's mixed
        chunked prefill) and costs only its tokens. Attention adds a cost per causal (query, key)
        pair, so a long history costs more than linearly and a cached prefix saves part of it.
        """
        base = self._pf0 if batch == 0 else 0.0
        return base + self._pf1 * prompt_tokens + self._pairs_time(cached_tokens, prompt_tokens)

    def _pairs_time(self, before: int, new: int) -> float:
        if not self._pf_pair or new <= 0:
            return 0.0
        end = before + new
        return self._pf_pair * (end * end - before * before) / 2.0

    def accept_prob(
        self, domain: str, key: int = 0, *, temperature: float = 0.0, top_p: float = 1.0, context_tokens: int = 0
    ) -> float:
        """Per-depth acceptance probability of a prompt of `domain` with prompt hash `key` (on an
        NGRAM server: on text the server has not generated before)."""
        acc = self.profile.acceptance
        spec = self.profile.speculative
        if acc is None or spec is None:
            return 0.0
        # Per-prompt variation, temperature and context scale the miss rate (1 - p): uniform in
        # effect whether p is 0.75 or 0.99, and p never leaves (0, 1).
        miss = (1.0 - getattr(acc, domain)) * math.exp(acc.prompt_spread * prompt_variation(key))
        miss *= temperature_miss_scale(self.profile.temperature, domain, temperature, top_p)
        miss *= window_miss_scale(spec.draft_window_tokens, spec.window_miss_per_doubling, context_tokens)
        miss *= context_miss_scale(spec.train_context_tokens, spec.context_miss_exponent, context_tokens)
        p = effective_accept_prob(spec, self._max_drafts, min(max(1.0 - miss, 0.0), 0.999), temperature, top_p)
        return min(max(p, 0.0), 0.999)

    def copy_accept_prob(self, temperature: float = 0.0, top_p: float = 1.0) -> float:
        """NGRAM: per-draft acceptance inside output that repeats text still in the trie."""
        ng = self.profile.ngram
        if ng is None:
            return 0.0
        miss = (1.0 - ng.copy_accept) * factor_at(ng.copy_temperature, temperature, top_p)
        return min(max(1.0 - miss, 0.0), 0.999)

    # ------------------------------------------------------------------- requests

    @property
    def num_running(self) -> int:
        return len(self._running) + (1 if self._chunked is not None else 0)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting and self._chunked is None

    def get(self, rid: str) -> SimRequest | None:
        return self._by_rid.get(rid)

    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of the waiting queue (O(queue); for load reports, not per step)."""
        return sum(r.prompt_tokens for r in self._waiting)

    def submit(
        self,
        rid: str,
        prompt_tokens: int,
        max_new_tokens: int,
        prompt_text: str = "",
        domain: str | None = None,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        prefix_blocks: Sequence[int] = (),
        stop_after_tokens: int | None = None,
        key: int | None = None,
        accept_scale: float = 1.0,
        priority: int | None = None,
        echo: float = 0.0,
    ) -> SimRequest:
        """Queue a request. The domain is read from `prompt_text` unless given.

        `temperature`/`top_p` lower acceptance (sampling.py); `prefix_blocks` is the prompt's hash
        chain for the prefix cache; `stop_after_tokens` ends the request with finish reason `stop`
        after that many tokens (the model's own end: an answer, a tool call) if it comes before
        `max_new_tokens`. `key` overrides the prompt hash that seeds per-prompt randomness.
        `accept_scale` multiplies this request's per-draft acceptance probability (a LoRA adapter
        request: `--lora-acceptance-scale`, an assumption). `priority` is the request's (after the
        tokenizer manager's default); it orders the queue only under priority scheduling.
        `echo` (NGRAM servers) is the share of the output that repeats text the server generated
        and still holds in its trie (`ngram.py`); a greedy prompt this server answered within its
        horizon repeats its output whole.
        Raises QueueFull when `max_queued` requests already wait (unless, under priority
        scheduling, it evicts a worse waiter into `aborted`), RequestAborted for a priority the
        server refuses (`abort_on_priority_when_disabled`), ValueError on a duplicate rid or a
        sampling parameter out of range.
        """
        if rid in self._by_rid:
            raise ValueError(f"duplicate request id {rid}")
        if not 0.0 <= temperature <= 2.0 or math.isnan(temperature):
            raise ValueError(f"temperature must be in [0, 2], got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        # `scheduler.py: _add_request_to_queue`: the priority first, then the queue limit
        if self._ranked:
            if priority is None:
                priority = self._least_preferred
        elif priority is not None and self._abort_unranked:
            raise RequestAborted(PRIORITY_DISABLED_MESSAGE)
        if (
            self.max_queued is not None
            and len(self._waiting) >= self.max_queued
            and not (self._ranked and self._evict_for(priority))
        ):
            raise QueueFull()
        if key is None:
            key = prompt_key(prompt_text) if prompt_text else 0
        occurrences = self._occurrences
        occurrence = occurrences.get(key, 0)
        occurrences[key] = occurrence + 1
        occurrences.move_to_end(key)
        if len(occurrences) > self._remembered_prompts:
            occurrences.popitem(last=False)  # the prompt seen least recently
        dom = domain or (classify(prompt_text) if prompt_text else "chat")
        prompt_tokens = max(1, prompt_tokens)
        req = SimRequest(
            rid,
            prompt_tokens,
            max(1, max_new_tokens),
            dom,
            _seed_of(self.seed, key, occurrence),
            min(
                self.accept_prob(dom, key, temperature=temperature, top_p=top_p, context_tokens=prompt_tokens)
                * accept_scale,
                0.999,
            ),
            self._max_drafts,
            key=key,
            temperature=temperature,
            top_p=top_p,
            prefix_blocks=prefix_blocks,
            stop_after_tokens=stop_after_tokens,
        )
        req.priority = priority
        memory = self.ngram_memory
        if memory is not None:
            greedy = temperature < GREEDY_BELOW
            if greedy and memory.answered(key):
                echo = 1.0
            req.remember_key = greedy
            if echo > 0.0:
                copy_p = min(self.copy_accept_prob(temperature, top_p) * accept_scale, 0.999)
                novel = req.accept_p
                m = self._max_drafts
                req.copy_steps = copy_step_share(min(echo, 1.0), tau(copy_p, m), tau(novel, m))
                req.copy_logp = math.log(copy_p) if copy_p > 0 else -math.inf
        self._waiting.append(req)
        self._by_rid[rid] = req
        return req

    def remember_output(self, blocks: Sequence[int]) -> None:
        """NGRAM: fingerprints (`ngram.fingerprints`) of an answer this server generated, so a
        later request that repeats it is drafted from the trie. No-op on other servers."""
        if self.ngram_memory is not None and blocks:
            self.ngram_memory.remember_text(blocks)

    def take_aborted(self) -> list[SimRequest]:
        """The requests the engine aborted on its own since the last call (evicted from a full
        queue, or retracted into one), each with its `abort_message`."""
        out, self.aborted = self.aborted, []
        return out

    def _evict_for(self, priority: int | None) -> bool:
        """`_abort_on_queued_limit` under priority scheduling: the least-preferred waiter (lowest
        priority, the newest on a tie) is aborted if `priority` is strictly better; else nothing
        changes and the arriving request is the one refused. An empty queue (`--max-queued-requests
        0`) refuses the arrival (assumption: SGLang's `max()` over the empty queue would raise)."""
        waiting = self._waiting
        if not waiting or priority is None or not isinstance(waiting, WaitingByPriority):
            return False
        worst = waiting.worst()
        assert worst.priority is not None
        if self._sign * priority >= self._sign * worst.priority:
            return False
        waiting.pop_worst()
        self._abort_itself(worst, PREEMPTED_MESSAGE)
        return True

    def _abort_itself(self, req: SimRequest, message: str) -> None:
        """A request leaves without finishing, by the scheduler's decision (a 503 to its client)."""
        del self._by_rid[req.rid]
        req.state = "aborted"
        req.finish_reason = "abort"
        req.abort_message = message
        self.aborted.append(req)

    def abort(self, rid: str) -> SimRequest | None:
        """Drop a waiting, prefilling or running request and free its slot; None if unknown."""
        req = self._by_rid.pop(rid, None)
        if req is None:
            return None
        if req.state == "waiting":
            self._waiting.remove(req)
        elif req.state == "prefilling":
            self._chunked = None
            self._kv_chunked = 0
        elif req.state == "running":
            self._running.remove(req)
            self._release_kv(req)
        req.state = "aborted"
        req.finish_reason = "abort"
        return req

    def cache_output(self, blocks: Sequence[int]) -> int:
        """Put a finished request's prompt + output chain in the prefix cache (next turns hit).

        Returns the number of newly cached blocks. Call it when the request's finishing
        emission arrives; the chain must start with the request's own `prefix_blocks`.
        """
        return self.cache.insert(blocks, self._cache_limit())

    # ----------------------------------------------------------------------- step

    def _cache_limit(self) -> int:
        return self.profile.max_total_num_tokens - self._outside_cache - self._kv_chunked

    def _used_tokens(self) -> int:
        return self._kv_running + self._kv_chunked

    def _release_kv(self, r: SimRequest) -> None:
        self._kv_running -= r.prompt_tokens + r.completion_tokens
        self._outside_cache -= r._outside_cache

    def _prefill(self) -> tuple[float, list[SimRequest], int, int, int]:
        """Continue the chunked prompt, then admit waiting requests (under priority preemption,
        retracting running ones to make room).

        Returns (seconds, requests whose prefill completed, admitted count, computed prompt
        tokens, cached prompt tokens of the admitted). A retracted request (one with output
        already) prefills its prompt and its output again.
        """
        budget = MAX_PREFILL_TOKENS
        seconds = 0.0
        done: list[SimRequest] = []
        computed = 0
        cached_now = 0
        admitted = 0
        chunked = self._chunked
        if chunked is not None:
            take = min(chunked._prefill_left, budget)
            seconds += self._pf1 * take + self._pairs_time(chunked._prefilled, take)
            chunked._prefill_left -= take
            chunked._prefilled += take
            budget -= take
            computed += take
            if chunked._prefill_left == 0:
                done.append(chunked)
                self._chunked = None
                self._kv_chunked = 0
        room = self.max_running - len(self._running) - (1 if self._chunked is not None else 0)
        kv_free = self.profile.max_total_num_tokens - self._used_tokens()
        new: list[SimRequest] = []
        retracted: list[SimRequest] = []
        while self._waiting and budget > 0 and self._chunked is None:
            req = self._waiting[0]
            need = req.prompt_tokens + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
            if room <= 0:
                # The batch is full. Under priority preemption the request may retract running
                # ones (`scheduler.py: get_new_batch_prefill` -> `preempt_to_schedule`).
                freed = self._preempt_for(req, need - kv_free, retracted) if self._preempt else None
                if freed is None:
                    break
                kv_free += freed
                # SGLang's batch stays full: each further request has to preempt for itself
                room = 1
            if need > kv_free and (new or done or self._running):
                break  # wait for running requests to free KV
            self._waiting.popleft()
            matched = self.cache.match(req.prefix_blocks) if req.prefix_blocks else 0
            cached = min(matched * PREFIX_BLOCK_TOKENS, req.prompt_tokens - 1)
            if not req.completion_tokens:
                # a retracted request keeps its first count (`schedule_batch.py`: cached_tokens
                # counted once, `retracted_stain`)
                req.cached_tokens = cached
            req._prefilled = cached
            # a retracted request recomputes its output too (its KV was freed, not cached)
            uncached = req.prompt_tokens + req.completion_tokens - cached
            take = min(uncached, budget)
            seconds += self._pf1 * take + self._pairs_time(cached, take)
            req._prefilled += take
            req._prefill_left = uncached - take
            budget -= take
            computed += take
            cached_now += cached
            admitted += 1
            room -= 1
            kv_free -= need
            new.append(req)
            if req._prefill_left:
                req.state = "prefilling"
                self._chunked = req
                self._kv_chunked = req.prompt_tokens + req.completion_tokens
            else:
                done.append(req)
        if retracted:
            self._requeue(retracted)
        if new:
            limit = self._cache_limit()
            for req in new:
                if req.prefix_blocks:
                    self.cache.insert(req.prefix_blocks, limit)
            total = computed + cached_now
            self._last_hit_rate = cached_now / total if total else 0.0
        if computed and not self._running:
            seconds += self._pf0  # a forward pass of its own (nothing to ride along)
        return seconds, done, admitted, computed, cached_now

    def _preempt_for(self, req: SimRequest, short: int, retracted: list[SimRequest]) -> int | None:
        """`PrefillAdder.preempt_to_schedule`: retract running requests for `req`, least preferred
        first (lowest priority, the newest on a tie), each worse than `req` by more than
        `--priority-scheduling-preemption-threshold`, until `short` KV tokens are freed (at least
        one request: a slot). Returns the KV tokens freed, None (nothing retracted) if the
        threshold or the memory is not met. The twin frees what a request holds (prompt +
        output); SGLang counts its reserved future tokens (assumption: the twin's KV model)."""
        running = self._running
        if not running:
            return None
        sign = self._sign
        threshold = self._threshold
        assert req.priority is not None
        # the common case first: not even the least preferred can be preempted
        least = min(running, key=_rank)
        assert least.priority is not None
        if (req.priority - least.priority) * -sign <= threshold:
            return None
        chosen: list[SimRequest] = []
        for r in sorted(running, key=_rank):
            assert r.priority is not None
            if (req.priority - r.priority) * -sign <= threshold:
                break
            chosen.append(r)
            short -= r.prompt_tokens + r.completion_tokens
            if short <= 0:
                break
        if short > 0:
            return None
        freed = 0
        for r in chosen:
            running.remove(r)
            freed += r.prompt_tokens + r.completion_tokens
            self._release_kv(r)
            # `schedule_batch.py: Req.reset_for_retract`: the output stays, the KV is gone
            r.state = "waiting"
            r._prefilled = 0
            r._prefill_left = 0
            r._outside_cache = 0
            retracted.append(r)
        return freed

    def _requeue(self, retracted: list[SimRequest]) -> None:
        """Retracted requests back to the queue, through the queue limit as any arrival
        (`_add_request_to_queue`): into a full queue one evicts a worse waiter or is aborted
        itself. In retraction order (assumption: SGLang iterates a set of them)."""
        for r in retracted:
            if (
                self.max_queued is not None
                and len(self._waiting) >= self.max_queued
                and not self._evict_for(r.priority)
            ):
                self._abort_itself(r, QUEUE_FULL_MESSAGE)
            else:
                self._waiting.append(r)

    def step(self) -> StepResult:
        """Run one engine iteration; an idle engine returns a zero-length empty step."""
        decode = self._running
        prefill_s, prefilled, admitted, computed, cached = (
            self._prefill() if (self._waiting or self._chunked is not None) else (0.0, [], 0, 0, 0)
        )
        # after the prefill pass: priority preemption may have retracted some of the batch
        batch = len(decode)
        kv_read = self._kv_running
        duration = self.step_time(batch, kv_tokens=kv_read)
        duration += prefill_s
        self._prefill_busy_us += int(prefill_s * 1e6)
        self._total_prompt += computed
        self._total_cached += cached
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
                if r.copy_steps and r._rng.random() < r.copy_steps:
                    logp = r.copy_logp + log_scale
                else:
                    logp = r._logp + log_scale
                u = r._rng.random()
                if u <= 0.0:
                    a = m
                elif logp == -math.inf:
                    a = 0
                else:
                    a = int(math.log(u) / logp)
                    if a > m:
                        a = m
                r.verify_ct += 1
                h = r.histogram
                if a >= len(h):
                    h.extend([0] * (a + 1 - len(h)))
                h[a] += 1
                r.correct_drafts += a
                r.proposed_drafts += proposed
                correct += a
                n = a + 1
                left = r.limit - r.completion_tokens
                if n >= left:
                    n = left
                verify_tokens += n
                generated += n
                r.completion_tokens += n
                r._outside_cache += n
                self._kv_running += n
                self._outside_cache += n
                if r.completion_tokens >= r.limit:
                    self._finish(r, emissions, n)
                else:
                    emissions.append(Emission(r.rid, n, False, None))
                    still.append(r)
        else:
            for r in decode:
                r.completion_tokens += 1
                r._outside_cache += 1
                generated += 1
                if r.completion_tokens >= r.limit:
                    self._kv_running += 1
                    self._outside_cache += 1
                    self._finish(r, emissions, 1)
                else:
                    emissions.append(Emission(r.rid, 1, False, None))
                    still.append(r)
            self._kv_running += len(still)
            self._outside_cache += len(still)
        for r in prefilled:
            r.state = "running"
            r.completion_tokens += 1  # the first token (a retracted request's next one)
            blocks_tokens = min(len(r.prefix_blocks) * PREFIX_BLOCK_TOKENS, r.prompt_tokens)
            r._outside_cache = r.prompt_tokens - blocks_tokens + r.completion_tokens
            self._kv_running += r.prompt_tokens + r.completion_tokens
            self._outside_cache += r._outside_cache
            generated += 1
            if r.completion_tokens >= r.limit:
                self._finish(r, emissions, 1)
            else:
                emissions.append(Emission(r.rid, 1, False, None))
                still.append(r)
        self._running = still
        if batch:
            self._count_decode(batch if spec else 0, verify_tokens, correct)
            step_us = float(int((duration - prefill_s) * 1e6))
            if step_us > 0:
                mo = self._moments
                decoded = verify_tokens if spec else batch
                mo[0] += 1.0
                mo[1] += batch
                mo[2] += step_us
                mo[3] += batch * batch
                mo[4] += batch * step_us
                mo[5] += decoded
        self._total_generated += generated
        self._busy_s += duration
        if batch or computed:
            self._window.append((duration, generated))
        return StepResult(duration, emissions, batch, self._width, admitted, computed, kv_read, cached)

    def _count_decode(self, verifies: int, verify_tokens: int, correct: int) -> None:
        self._total_verify_ct += verifies
        self._total_verify_tokens += verify_tokens
        iv = self._interval
        iv.steps += 1
        iv.verify_ct += verifies
        iv.accept_tokens += verify_tokens
        iv.correct += correct
        if iv.steps >= DECODE_LOG_INTERVAL:
            if iv.verify_ct:
                proposed = iv.verify_ct * self._proposed_per_verify
                self._published_accept = (iv.accept_tokens / iv.verify_ct, iv.correct / proposed if proposed else 0.0)
            self._published_total = (self._total_verify_tokens, self._total_verify_ct)
            self._interval = _Interval()

    def _finish(self, r: SimRequest, emissions: list[Emission], n: int) -> None:
        r.state = "finished"
        r.finish_reason = r.limit_reason
        del self._by_rid[r.rid]
        self._release_kv(r)
        emissions.append(Emission(r.rid, n, True, r.limit_reason))
        memory = self.ngram_memory
        if memory is not None:
            memory.generated(r.completion_tokens)
            if r.remember_key:
                memory.remember_prompt(r.key)

    # ---------------------------------------------------------------------- stats

    def stats(self) -> EngineStats:
        """Current gauges (see EngineStats for the three forms of acceptance)."""
        used = self._used_tokens()
        dur = sum(w[0] for w in self._window)
        gen = sum(w[1] for w in self._window)
        tokens, verifies = self._published_total
        spec = self._max_drafts > 0
        prompt_all = self._total_prompt + self._total_cached
        return EngineStats(
            num_running=self.num_running,
            num_waiting=len(self._waiting),
            num_used_tokens=used,
            token_usage=used / self.profile.max_total_num_tokens,
            gen_throughput=gen / dur if dur > 0 else 0.0,
            accept_length=self._published_accept[0],
            accept_rate=self._published_accept[1],
            lifetime_accept_length=tokens / verifies if spec and verifies else None,
            live_accept_length=(self._total_verify_tokens / self._total_verify_ct if self._total_verify_ct else 0.0),
            total_verify_ct=self._total_verify_ct,
            total_generated_tokens=self._total_generated,
            total_prompt_tokens=self._total_prompt,
            total_cached_tokens=self._total_cached,
            cache_hit_rate=self._last_hit_rate,
            lifetime_cache_hit_rate=self._total_cached / prompt_all if prompt_all else 0.0,
            cached_blocks_tokens=self.cache.num_tokens,
            busy_s=self._busy_s,
            decode_moments=tuple(self._moments) if self._moments[0] else None,
            total_prefill_busy_us=self._prefill_busy_us,
        )
