"""SGLang's router's policies, as baselines: what a user gets from a homogeneous fleet behind it.

Implemented from the router's source, `lightseekorg/smg` (SGLang's model gateway, which the
`sglang-router` package ships), `model_gateway/src/policies/`:

- `round_robin.rs`: a counter over the healthy workers.
- `random.rs`: uniform over the healthy workers.
- `power_of_two.rs`: two distinct workers drawn at random, the one with the lower load wins
  (ties to the first). The load is the worker's cached token load (`kv_cache_tokens`, its KV
  tokens in use from the load poll) when both have one, else the router's in-flight counts.
- `least_load.rs`: the lowest `(queued_tokens + inflight_tokens) / throughput
  + kv_pressure_weight * k / (1 - k)` with `queued_tokens` the worker's waiting uncached tokens,
  `throughput` its `gen_throughput` (default 2000 tok/s when absent), `k` its token usage
  (clamped to 0.999), `kv_pressure_weight` 0.15 s, and `inflight_tokens` the token work the
  router dispatched since the last poll (the HTTP path does not know a request's tokens: 1024 per
  request, `DEFAULT_MEAN_PREFILL_TOKENS`), reset by each poll; a fleet without any load report
  falls back to the fewest in flight.
- `cache_aware.rs`: when the load is imbalanced, `max - min > balance_abs_threshold` (64) and
  `max > balance_rel_threshold * min` (1.5) over the router's in-flight counts, the least
  loaded worker; otherwise the approximate tree: the worker whose recorded requests share the
  longest prefix with this one, if that prefix is more than `cache_threshold` (0.3) of the
  request's text, else the least loaded worker (`miss="min_load"`, the HTTP string-tree path of
  the current source; the older `sgl-router` took the worker with the smallest tree:
  `miss="smallest_tree"`). Either way the request is inserted into the chosen worker's tree.
  Trees are bounded by `max_tree_size` (2^26 characters per worker) with LRU eviction of leaves.

The tree here works on the prompt's block chain (`RequestFeatures.prefix`, 64-token blocks)
instead of characters, so a match is counted in whole blocks: the match rate is matched blocks x
64 / prompt tokens, the same ratio as characters when a token is about 4 characters. Loads
(`update_loads`) arrive every `poll_s` = 10 s, the router's default `load_check_interval_secs`.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import random
from collections.abc import Mapping, Sequence

import msgspec

from policies.base import BackendView, Decision, NoCandidate, Outcome, RequestFeatures

__all__ = [
    "PEER_POLICIES",
    "CacheAware",
    "LeastLoad",
    "LoadSnapshot",
    "PowerOfTwo",
    "RandomPeer",
    "RoundRobinPeer",
    "make_peer",
]

BLOCK_TOKENS = 64
CHARS_PER_TOKEN = 4
POLL_S = 10.0


class LoadSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What the router's load poll reads from one worker (`/v1/loads`)."""

    num_used_tokens: int
    token_usage: float
    gen_throughput: float
    num_waiting_uncached_tokens: int


def _healthy(candidates: Sequence[BackendView]) -> list[BackendView]:
    out = [c for c in candidates if c.healthy]
    if not out:
        raise NoCandidate("no healthy worker")
    return out


def _least_inflight(pool: Sequence[BackendView]) -> BackendView:
    return min(pool, key=lambda v: v.inflight)  # Rust's min_by_key: the first of equal loads


class _Peer:
    name = "sglang"
    poll_s = POLL_S

    def observe(self, outcome: Outcome) -> None:
        pass

    def update_loads(self, loads: Mapping[str, LoadSnapshot]) -> None:
        pass


class RoundRobinPeer(_Peer):
    name = "sglang/round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        return Decision(backend=pool[next(self._counter) % len(pool)], reason="round_robin")


class RandomPeer(_Peer):
    name = "sglang/random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        return Decision(backend=pool[self._rng.randrange(len(pool))], reason="random")


class PowerOfTwo(_Peer):
    name = "sglang/power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._tokens: dict[str, int] = {}

    def update_loads(self, loads: Mapping[str, LoadSnapshot]) -> None:
        self._tokens = {name: s.num_used_tokens for name, s in loads.items()}

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        if len(pool) == 1:
            return Decision(backend=pool[0], reason="power_of_two: one worker")
        i = self._rng.randrange(len(pool))
        j = (i + 1 + self._rng.randrange(len(pool) - 1)) % len(pool)
        a, b = pool[i], pool[j]
        ta, tb = self._tokens.get(a.name), self._tokens.get(b.name)
        la, lb = (ta, tb) if ta is not None and tb is not None else (a.inflight, b.inflight)
        return Decision(backend=a if la <= lb else b, reason=f"power_of_two: {la} vs {lb}")


class LeastLoad(_Peer):
    name = "sglang/least_load"
    kv_pressure_weight = 0.15
    mean_prefill_tokens = 1024
    default_throughput = 2000.0

    def __init__(self) -> None:
        self._loads: dict[str, LoadSnapshot] = {}
        self._inflight_tokens: dict[str, int] = {}

    def update_loads(self, loads: Mapping[str, LoadSnapshot]) -> None:
        self._loads = dict(loads)
        for name in loads:
            self._inflight_tokens[name] = 0

    def _score(self, v: BackendView, nominal: float, fleet_has_loads: bool) -> float:
        snap = self._loads.get(v.name)
        if snap is not None:
            tp = snap.gen_throughput if snap.gen_throughput > 0 else self.default_throughput
            k = min(max(snap.token_usage, 0.0), 0.999)
            return (
                snap.num_waiting_uncached_tokens + self._inflight_tokens.get(v.name, 0)
            ) / tp + self.kv_pressure_weight * k / (1.0 - k)
        if fleet_has_loads:
            return v.inflight * self.mean_prefill_tokens / nominal
        return float(v.inflight)

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        if len(pool) == 1:
            return Decision(backend=pool[0], reason="least_load: one worker")
        tps = [s.gen_throughput for v in pool if (s := self._loads.get(v.name)) is not None and s.gen_throughput > 0]
        nominal = sum(tps) / len(tps) if tps else self.default_throughput
        has = any(v.name in self._loads for v in pool)
        best = pool[0]
        best_score = self._score(best, nominal, has)
        for v in pool[1:]:
            score = self._score(v, nominal, has)
            if score < best_score:
                best, best_score = v, score
        self._inflight_tokens[best.name] = self._inflight_tokens.get(best.name, 0) + self.mean_prefill_tokens
        return Decision(backend=best, reason=f"least_load {best_score:.3f}", score=best_score)


class _Tree:
    """One worker's recorded prefixes: chain element -> None in LRU order (oldest first).

    Inserting touches a chain leaf first, so an element is always newer than its descendants and
    the set stays prefix-closed under LRU eviction: whether a worker holds the first n elements
    of a chain is monotone in n, so the longest match is found by bisection."""

    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks: collections.OrderedDict[int, None] = collections.OrderedDict()

    def match(self, chain: Sequence[int]) -> int:
        blocks = self.blocks
        if not chain or chain[0] not in blocks:
            return 0
        # the largest n with chain[n - 1] held (monotone): bisect over 1..len(chain)
        return bisect.bisect_left(range(1, len(chain) + 1), True, key=lambda n: chain[n - 1] not in blocks)

    def insert(self, chain: Sequence[int], limit: int) -> None:
        blocks = self.blocks
        for b in reversed(chain):
            if b in blocks:
                blocks.move_to_end(b)
            else:
                blocks[b] = None
        while len(blocks) > limit:
            blocks.popitem(last=False)


class CacheAware(_Peer):
    name = "sglang/cache_aware"

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_size: int = 1 << 26,
        miss: str = "min_load",
    ) -> None:
        if miss not in ("min_load", "smallest_tree"):
            raise ValueError(f"miss is min_load or smallest_tree, not {miss!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_blocks = max(1, max_tree_size // (BLOCK_TOKENS * CHARS_PER_TOKEN))
        self.miss = miss
        self._trees: dict[str, _Tree] = {}
        self._last_used: dict[str, int] = {}  # tie-break among workers holding the same match
        self._tick = 0

    def _tree(self, name: str) -> _Tree:
        tree = self._trees.get(name)
        if tree is None:
            tree = self._trees[name] = _Tree()
        return tree

    def choose(self, request: RequestFeatures, candidates: Sequence[BackendView]) -> Decision:
        pool = _healthy(candidates)
        self._tick += 1
        loads = [v.inflight for v in candidates]  # the router folds over all workers, healthy or not
        lo, hi = min(loads), max(loads)
        chain = request.prefix
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            chosen, reason = _least_inflight(pool), "cache_aware: imbalanced, least loaded"
        else:
            best: BackendView | None = None
            best_n = 0
            for v in pool:
                n = self._tree(v.name).match(chain)
                if n > best_n or (
                    n == best_n
                    and n
                    and best is not None
                    and self._last_used.get(v.name, 0) > self._last_used.get(best.name, 0)
                ):
                    best, best_n = v, n
            rate = best_n * BLOCK_TOKENS / request.prompt_tokens if request.prompt_tokens > 0 else 0.0
            if best is not None and rate > self.cache_threshold:
                chosen, reason = best, f"cache_aware: match {rate:.2f}"
            elif self.miss == "smallest_tree":
                chosen = min(pool, key=lambda v: len(self._tree(v.name).blocks))
                reason = f"cache_aware: match {rate:.2f}, smallest tree"
            else:
                chosen, reason = _least_inflight(pool), f"cache_aware: match {rate:.2f}, least loaded"
        if chain:
            self._tree(chosen.name).insert(chain, self.max_blocks)
        self._last_used[chosen.name] = self._tick
        return Decision(backend=chosen, reason=reason)


PEER_POLICIES: tuple[str, ...] = (
    "sglang/round_robin",
    "sglang/power_of_two",
    "sglang/least_load",
    "sglang/cache_aware",
)


def make_peer(name: str, seed: int | None = None) -> _Peer:
    """A fresh SGLang router policy by its contestant name (`sglang/...`)."""
    if name == "sglang/round_robin":
        return RoundRobinPeer()
    if name == "sglang/random":
        return RandomPeer(seed)
    if name == "sglang/power_of_two":
        return PowerOfTwo(seed)
    if name == "sglang/least_load":
        return LeastLoad()
    if name == "sglang/cache_aware":
        return CacheAware()
    raise ValueError(f"unknown SGLang router policy {name!r} (known: {', '.join(PEER_POLICIES)}, sglang/random)")
