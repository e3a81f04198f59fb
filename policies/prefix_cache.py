"""Which backend holds which conversation prefix, in bounded memory.

The tracker works on every `TRACK_STRIDE`-th element of a request's chain (`policies.prefix`):
element 4k+3 identifies the first 4(k+1) 64-token blocks, so a tracked block is 256 tokens.
Affinity pays where a history is long (a re-prefill of thousands of tokens costs a second or more
on K2.6); there 256 tokens of slack are noise, while every block a request adds costs an insert and,
later, an eviction on the request path. A chat turn (~150-token question, ~400-token answer) adds
about two tracked blocks.

Each backend has a set of the tracked block hashes of the requests sent to it, holding at most its
KV budget in blocks (`max_total_num_tokens / TRACKED_TOKENS`): the server's radix cache
cannot keep more either, so a block this tracker forgot is one the server has most likely evicted
too. The least recently used blocks go first. Memory is O(sum of capacities), whatever the number
of conversations.

A request stamps all its blocks at once, so a block's ancestors are always at least as recent as
it is and eviction takes leaves no later than their roots, as the radix cache does. The held part
of any chain is therefore a prefix of it, and the depth held is found by binary search.

Lookups go through one index over all backends, block hash -> bit mask of the backends holding it
(bit = the backend's slot), so that a request is matched against the whole pool in a few lookups:
one when no backend holds its first block (a new conversation), and otherwise one binary search per
distinct depth among the holders (typically two: the backend holding the conversation and those
holding only a shared system prompt), not one per backend.
"""

from __future__ import annotations

from itertools import islice, repeat

from policies.prefix import BLOCK_TOKENS

__all__ = ["DEFAULT_KV_TOKENS", "TRACKED_TOKENS", "TRACK_STRIDE", "BackendBlocks", "PrefixCache", "tracked"]

TRACK_STRIDE = 4
TRACKED_TOKENS = TRACK_STRIDE * BLOCK_TOKENS  # tokens per tracked block


def tracked(chain: tuple[int, ...]) -> tuple[int, ...]:
    """The elements of a request's chain the tracker keeps (each identifies a 256-token prefix)."""
    return chain[TRACK_STRIDE - 1 :: TRACK_STRIDE]


# Assumption when a backend does not report `max_total_num_tokens`: about what SGLang gives K2.6
# at TP8 with ~19 GB of KV per GPU (the twin's profiles use 260,000).
DEFAULT_KV_TOKENS = 262_144
_MIN_BLOCKS = 16
_SAMPLE = 128  # stamps sampled to place an eviction's cutoff
_MASK_MEMO = 4096  # holder sets remembered with their names (a pool of 16 shows a few dozen)


class BackendBlocks:
    """The block hashes one backend is believed to hold, each with the stamp of its last use."""

    __slots__ = ("blocks", "capacity", "evicted", "bit", "_stamp", "_index")

    def __init__(self, capacity: int, bit: int, index: dict[int, int]) -> None:
        self.blocks: dict[int, int] = {}
        self.capacity = capacity
        self.evicted = 0
        self.bit = bit
        self._stamp = 0
        self._index = index

    def depth(self, chain: tuple[int, ...]) -> int:
        """How many leading blocks of `chain` are held here."""
        blocks = self.blocks
        if not chain or chain[0] not in blocks:
            return 0
        lo, hi = 0, len(chain) - 1  # chain[lo] is held; find the deepest held index
        if chain[hi] in blocks:
            return hi + 1
        while lo < hi - 1:
            mid = (lo + hi) >> 1
            if chain[mid] in blocks:
                lo = mid
            else:
                hi = mid
        return lo + 1

    def record(self, chain: tuple[int, ...], held: int = 0) -> None:
        """The backend served `chain`: all of it is held now, stamped as just used. `held`: how
        many leading blocks it held before (`depth`), so only the new ones enter the index."""
        self._stamp += 1
        blocks = self.blocks
        blocks.update(zip(chain, repeat(self._stamp)))
        if held < len(chain):
            index, bit = self._index, self.bit
            get = index.get
            for h in islice(chain, held, None):
                index[h] = get(h, 0) | bit
        if len(blocks) > self.capacity:
            self._evict(len(blocks) - (self.capacity * 3) // 4)

    def _evict(self, drop: int) -> None:
        """Drop about `drop` of the least recently used blocks, by stamp.

        Every use of a block stamps all its ancestors alike, so an ancestor's stamp is never older
        than its descendants': dropping by stamp takes leaves no later than their roots and the
        held part of a chain stays a prefix. Done in bulk (one pass over the dict per quarter of
        the capacity inserted) so that it costs O(1) amortized per block instead of an ordered
        structure's bookkeeping on every touch. The cutoff comes from a strided sample of the
        stamps: sorting them all would cost more than the pass."""
        blocks = self.blocks
        step = max(len(blocks) // _SAMPLE, 1)
        sample = sorted(islice(blocks.values(), 0, None, step))
        cutoff = sample[min(len(sample) - 1, drop * len(sample) // len(blocks))]
        if cutoff <= sample[0]:  # too few distinct stamps to split finely: drop the oldest one whole
            cutoff = sample[0] + 1
        kept = {h: s for h, s in blocks.items() if s >= cutoff}
        index, clear = self._index, ~self.bit
        get = index.get
        for h in blocks.keys() - kept.keys():
            m = get(h, 0) & clear
            if m:
                index[h] = m
            else:
                del index[h]
        self.evicted += len(blocks) - len(kept)
        self.blocks = kept

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        if len(self.blocks) > capacity:
            self._evict(len(self.blocks) - capacity)

    def clear(self) -> None:
        index, clear = self._index, ~self.bit
        for h in self.blocks:
            m = index.get(h, 0) & clear
            if m:
                index[h] = m
            else:
                index.pop(h, None)
        self.evicted += len(self.blocks)
        self.blocks = {}


class PrefixCache:
    """Per-backend `BackendBlocks`, created on first sight and sized from the KV budget, plus the
    pool-wide index that answers "how deep does each backend hold this chain" in a few lookups."""

    def __init__(self, default_kv_tokens: int = DEFAULT_KV_TOKENS) -> None:
        if default_kv_tokens < TRACKED_TOKENS:
            raise ValueError(f"default_kv_tokens must be >= {TRACKED_TOKENS}, got {default_kv_tokens}")
        self.default_kv_tokens = default_kv_tokens
        self.backends: dict[str, BackendBlocks] = {}
        self.bits: dict[str, int] = {}  # backend name -> its bit (kept when it leaves: names are few)
        self.names: dict[int, str] = {}  # and back
        self.index: dict[int, int] = {}
        self._mask_names: dict[int, tuple[str, ...]] = {}  # bits never change owner: never stale

    @staticmethod
    def capacity_for(kv_tokens: int) -> int:
        return max(kv_tokens // TRACKED_TOKENS, _MIN_BLOCKS)

    def of(self, name: str, kv_tokens: int | None = None) -> BackendBlocks:
        """The tracker of backend `name`, resized when its reported KV budget changed."""
        b = self.backends.get(name)
        if b is None:
            bit = self.bits.get(name)
            if bit is None:
                bit = self.bits[name] = 1 << len(self.bits)
                self.names[bit] = name
            cap = self.capacity_for(kv_tokens or self.default_kv_tokens)
            b = self.backends[name] = BackendBlocks(cap, bit, self.index)
        elif kv_tokens and kv_tokens > 0:
            cap = self.capacity_for(kv_tokens)
            if cap != b.capacity:
                b.resize(cap)
        return b

    def depths(self, chain: tuple[int, ...]) -> dict[str, int]:
        """Name of each backend holding the first block of `chain` (tracked elements) -> how many
        leading blocks it holds. Empty when no backend holds any of it."""
        get = self.index.get
        remaining = get(chain[0], 0) if chain else 0
        if not remaining:
            return {}
        out: dict[str, int] = {}
        names_of = self._names_of
        top = len(chain)  # no remaining backend holds chain[top]
        while remaining:
            # the deepest index below top held by a remaining backend: a binary search, because
            # what they hold together is a prefix of the chain (chain[0] is held by all of them)
            lo, holders = 0, remaining
            while top - lo > 1:
                mid = (lo + top) >> 1
                m = get(chain[mid], 0) & remaining
                if m:
                    lo, holders = mid, m
                else:
                    top = mid
            out.update(dict.fromkeys(names_of(holders), lo + 1))
            remaining ^= holders
            top = lo
        return out

    def _names_of(self, mask: int) -> tuple[str, ...]:
        """The names of the backends whose bits are set in `mask`. Memoized: a pool shows few
        distinct holder sets, and the expansion bit by bit would run on every request."""
        names = self._mask_names.get(mask)
        if names is None:
            if len(self._mask_names) >= _MASK_MEMO:
                self._mask_names.clear()
            found: list[str] = []
            bits = mask
            while bits:
                bit = bits & -bits
                found.append(self.names[bit])
                bits ^= bit
            names = self._mask_names[mask] = tuple(found)
        return names

    def forget(self, name: str) -> None:
        """The backend restarted or left: its cache is gone."""
        b = self.backends.pop(name, None)
        if b is not None:
            b.clear()

    def held_blocks(self) -> int:
        return sum(len(b.blocks) for b in self.backends.values())

    def describe(self) -> dict[str, dict[str, int]]:
        return {
            name: {"blocks": len(b.blocks), "capacity": b.capacity, "evicted": b.evicted}
            for name, b in self.backends.items()
        }
