"""What one more request costs a backend: the goodput policy's cost model.

Own time of a request of acceptance cell `c` sent to a backend holding `load` requests (running
and waiting), `pending` prompt tokens of earlier requests not yet prefilled there (SGLang prefills
first come, first served) and `uncached` tokens of its own prompt that the radix cache does not
hold:

    ttft = step_s(1) + prefill_stall_s(uncached)          idle: a forward pass of its own
         | 1.5 step_s(load + 1) + prefill_stall_s(uncached)   busy: the rest of the current pass,
                                                          then its prefill rides in the next one
         + prefill_stall_s(pending)                       behind the prompts queued before it
         + (load + 1 - cap) x life / cap                  if the backend is full: waiting for a slot
                                                          (x decode instead of life where only the KV
                                                          pool is full)
    own  = ttft_weight x ttft + decode,   decode = out x step_s(load + 1) / accept(c)
         + slo_weight x (ttft - ttft_slo_s)               for the part of a TTFT beyond the SLO
         + slo_weight x out x (tpot - tpot_slo_s)         for a decode slower than the TPOT SLO,
                                                          tpot = step_s(load + 1) / accept(c)
         + slo_weight x lost x met                        the request lost to goodput (below)

**Waiting for a slot.** Past its `max_running_requests` (`load + 1 > max_running`) a backend
admits the request once `load + 1 - cap` of the requests ahead of it have finished. Its `cap`
slots free once per `life`, the time a request holds its slot there: each place in the queue waits
`life / cap`. `life` is measured (`life_s`: the decode seconds of the requests that finished there
lately), else predicted for a typical request, `typical_out x step_s(cap) / accept(c)`. It is not
this request's own decode: a short answer queued behind 40 long ones waits for them (priced by its
own length, it waited a quarter of what it was predicted to, and the speculative servers of a
mixed fleet kept queues of 15 s while the AR server beside them had room). Where the KV pool binds
first (`kv_bound` below `max_running`) the request waits for room, which requests like it free,
not for a slot: there it waits `(load + 1 - cap) / cap x decode`, its own decode's share.

**Lost to goodput.** A request past either SLO counts 0 to goodput however small the overrun, so
besides the overrun's seconds it costs `met = ttft_slo_s + out x tpot_slo_s`, the time a request
that just made both takes (the same for every candidate). `lost` is 1 past the TPOT SLO. Past the
TTFT SLO on a backend whose slots are all taken it grows from 0 at the SLO to 1 at twice it,
`(ttft - ttft_slo_s) / ttft_slo_s`: a predicted TTFT is uncertain by about the SLO itself near
capacity, and a step at the SLO moves requests whose prediction sits on the edge. A TTFT past the
SLO elsewhere (a long prompt's own prefill, a KV pool full of long contexts) is priced by the
second only: such a request is late on most candidates, and pricing it as lost sent long prompts
to the AR server of a mixed pool and lengthened the Mooncake trace's e2e tail. Without the term a
short answer could go to a busy AR backend whose e2e looks cheapest while every token comes late,
or queue behind a speculative server's cap while an AR server would serve it within the SLO.

where a prefill's time counts its tokens and its attention's causal (query, key) pairs
(`policies.prefill`): a prompt's last tokens attend to everything before them, cached or not.

A request of `k` sequences (`n` > 1, a completions batch) decodes them side by side: `load + 1`
above becomes `load + k`, its prefill is done once, and it is one request's own time.

Time it imposes on the `n = min(load, cap)` requests running there, and on those queued behind it:

    imposed = n x (prefill_stall_s(uncached)              its prefill tokens ride in their passes
                   + passes x (step_s(load + 1) - step_s(load)))   and every shared pass is slower
            + (load + 1 - cap) x decode / cap             past max_running: it holds a slot for its decode

with `passes = out / accept(c)`, the passes this request decodes for. Under a TPOT SLO its prefill
also costs the running requests it pushes past it (below). Over its life it shares
passes with the requests running now (each for about half of them, on average) and with those
that arrive while it runs: in steady state as many again (Little's law), also for about half.
So it slows about `n` requests by `passes` passes' worth, twice the count of those present now.
Past `max_running` it also takes a slot the requests queued behind it wait for, as many as wait
ahead of it now in steady state: each of them waits its decode's share of the cap longer.

**Residents pushed past the TPOT SLO.** Each request running there (`BackendView.residents`)
has decoded at a pace of `tpot_now` seconds a token so far (its stream's chunks; a speculative
server's chunk is a verify pass, `accept(c)` tokens); at that pace it ends with that TPOT, and
this request's prefill adds `stall / (expected - 1)` to it. Those for which that crosses the SLO
are lost to goodput, each costing `met` as above:

    imposed += slo_weight x met x #{residents: tpot_now <= tpot_slo_s < tpot_now + stall / (expected - 1)}

Summed seconds alone send a long prompt where the fewest requests run, and a decode-heavy request
away from a server whose passes read long contexts: the long prompts gather on one server and its
residents miss the TPOT SLO while the others' have room (the Azure trace on four AR servers,
docs/evaluation.md). The count holds the stall against each resident's own slack instead.

The latency objective minimizes `own + externality x imposed`: with weight 1 that is the increase
of the summed completion time of every request in the pool, so per-request choices add up to the
least total time instead of herding onto the fastest backend.

The estimate objects only need `accept_at`, `step_s`, `max_running`, `prefill_s` and
`prefill_stall_s` (`policies.estimates.RateModel`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from policies.base import PACE_CHUNKS, Resident

__all__ = ["CostModel", "kv_bound", "own_and_imposed_s", "throughput_gain"]

_INF = float("inf")


class CostModel(Protocol):
    max_running: int

    def accept_at(self, c: int) -> float: ...

    def step_s(self, load: int) -> float: ...

    def prefill_s(self, uncached: int, pairs: float = 0.0) -> float: ...

    def prefill_stall_s(self, uncached: int, pairs: float = 0.0) -> float: ...


def kv_bound(kv_tokens: int | None, request_tokens: float, typical_tokens: float = 0.0) -> int:
    """How many requests can run on a KV pool of `kv_tokens` once this one (prompt + expected
    output, `request_tokens`) is admitted beside others of `typical_tokens` each (default: its own
    size); 0 if unknown. SGLang admits a request only while its KV fits, so on long contexts the
    pool binds long before `max_running_requests`: 259k tokens hold three 70k-token agent calls,
    about nineteen of the 13k-token requests of Kimi's trace, not 48 of either."""
    if not kv_tokens or request_tokens <= 0:
        return 0
    typical = typical_tokens if typical_tokens > 0 else request_tokens
    room = kv_tokens - request_tokens
    return 1 + int(room // typical) if room > 0 else 1


def _slot_life(est: CostModel, cap: int, acc: float, out: float, typical_out: float, life_s: float) -> float:
    """Seconds a request holds a slot of a full backend: as measured there (`life_s`), else a
    typical request's decode at the cap (`typical_out` tokens, or this one's `out` before any)."""
    if life_s > 0:
        return life_s
    return (typical_out if typical_out > 0 else out) * est.step_s(cap) / acc


def own_and_imposed_s(
    est: CostModel,
    c: int,
    load: int,
    uncached: int,
    out: float,
    externality: float,
    ttft_weight: float = 1.0,
    pending: int = 0,
    ttft_slo_s: float = float("inf"),
    slo_weight: float = 0.0,
    sequences: int = 1,
    pairs: float = 0.0,
    pending_pairs: float = 0.0,
    tpot_slo_s: float = float("inf"),
    cap: int = 0,
    typical_out: float = 0.0,
    life_s: float = 0.0,
    residents: Collection[Resident] = (),
) -> float:
    """Predicted seconds: this request's own TTFT (x `ttft_weight`) + decode, plus `externality` x
    what it adds to the requests running beside it. `pairs` and `pending_pairs` are the causal
    attention pairs of `uncached` and of `pending` (`policies.prefill.causal_pairs`). It runs for
    every candidate of every decision: arguments by position. `cap`: the requests the backend
    can run at once if fewer than its `max_running` (its KV pool's bound, `kv_bound`).
    `life_s`: seconds a request holds a slot of this backend, as measured (0: not measured, then
    predicted from `typical_out`, a typical request's expected output, or else this one's `out`);
    a full backend frees `cap` slots per `life_s`. `residents`: the requests running there, for the
    ones its prefill would push past the TPOT SLO."""
    acc = est.accept_at(c)
    n1 = load + sequences
    step = est.step_s(n1)
    decode = out * step / acc
    # idle: a forward pass of its own; busy: the rest of the current pass, then its prefill rides
    # in the next one; either way after the prompts queued before it (SGLang prefills FCFS)
    stall = est.prefill_stall_s(uncached, pairs)
    ttft = 1.5 * step + stall if load else est.prefill_s(uncached, pairs)
    if pending or pending_pairs:
        ttft += est.prefill_stall_s(pending, pending_pairs)
    slots = est.max_running
    queued = n1 > slots  # past its max_running_requests: it waits in the server's queue for a slot
    if not cap or cap > slots:
        cap = slots
    if queued:
        # the requests ahead of it free `cap` slots per typical life: it waits for `n1 - cap` of them
        ttft += (n1 - cap) / cap * _slot_life(est, cap, acc, out, typical_out, life_s)
    elif n1 > cap:
        # the KV pool binds first: it waits for room, which the requests like it free (kv_bound)
        ttft += (n1 - cap) / cap * decode
    cost = ttft_weight * ttft + decode
    over = ttft - ttft_slo_s
    if over > 0:
        cost += slo_weight * over
    tpot = step / acc
    lost = 0.0
    if tpot > tpot_slo_s:
        cost += slo_weight * out * (tpot - tpot_slo_s)
        lost = 1.0
    elif over > 0 and queued:
        lost = over / ttft_slo_s if over < ttft_slo_s else 1.0
    if lost:
        # lost to goodput: as much again as a request that just made the SLO takes (docstring)
        cost += lost * slo_weight * _met_s(ttft_slo_s, tpot_slo_s, out, decode)
    if externality and load:
        running = load if load < cap else cap
        slower = step - est.step_s(load)
        passes = out / acc  # passes this request shares with others (see the module docstring)
        cost += externality * running * (stall + passes * (slower if slower > 0 else 0.0))
        if queued:
            # the requests queued behind it (as many as wait ahead of it now, in steady state) each
            # wait its decode's share of the cap longer
            cost += externality * (n1 - cap) * decode / cap
        if residents and stall > 0 and tpot_slo_s < _INF:
            pushed = _pushed_past(residents, stall, acc, tpot_slo_s)
            if pushed:
                typical = typical_out if typical_out > 0 else out
                cost += externality * slo_weight * pushed * _met_s(ttft_slo_s, tpot_slo_s, typical, 0.0)
    return cost


def _met_s(ttft_slo_s: float, tpot_slo_s: float, tokens: float, decode: float) -> float:
    """`met`: the seconds a request of `tokens` output that just made both SLOs takes (`decode`,
    its predicted decode, where there is no TPOT SLO; no TTFT SLO counts nothing)."""
    return (ttft_slo_s if ttft_slo_s < _INF else 0.0) + (tokens * tpot_slo_s if tpot_slo_s < _INF else decode)


def _pushed_past(residents: Collection[Resident], stall: float, acc: float, tpot_slo_s: float) -> int:
    """How many of `residents` a prefill holding their passes up `stall` seconds pushes past
    `tpot_slo_s`: each ends at the pace it has kept so far (chunks of `acc` tokens), plus the stall
    spread over its expected tokens (the module docstring)."""
    pushed = 0
    for r in residents:
        p = r.progress
        chunks = p.generated
        t_first, t_last = p.t_first, p.t_last
        if chunks < PACE_CHUNKS or t_first is None or t_last is None:
            continue  # not decoding yet, or not streamed: no pace to hold against the SLO
        tokens = chunks * acc
        # past what was expected of it (or nothing was): as many tokens again, the median guess
        expected = r.expected_tokens if r.expected_tokens > tokens else 2.0 * tokens
        tpot = (t_last - t_first) / ((chunks - 1) * acc)
        if tpot <= tpot_slo_s < tpot + stall / (expected - 1.0):
            pushed += 1
    return pushed


def throughput_gain(
    est: CostModel,
    c: int,
    load: int,
    uncached: int,
    out: float,
    *,
    sequences: int = 1,
    pairs: float = 0.0,
    cap: int = 0,
    typical_out: float = 0.0,
    life_s: float = 0.0,
    pending: int = 0,
    pending_pairs: float = 0.0,
) -> float:
    """Tok/s the backend's aggregate gains with one more request (of `sequences`), less what its
    prefill costs the running ones, spread over the request's decode time. `cap`, `typical_out`
    and `life_s` as for `own_and_imposed_s`: on a full backend (its KV pool's bound included) the
    request adds nothing while it waits, and runs at its own rate only for the part of its life
    past the wait."""
    acc = est.accept_at(c)
    if not cap or cap > est.max_running:
        cap = est.max_running
    n1 = load + sequences
    after = acc * (n1 if n1 < cap else cap) / est.step_s(n1)
    before = acc * (load if load < cap else cap) / est.step_s(load) if load > 0 else 0.0
    gain = after - before
    # its tokens come only after the prompts queued there are prefilled and, on a full backend, a
    # slot frees: less the tokens it does not make meanwhile, spread over its decode as the tokens
    # its prefill takes from the running ones are (below)
    delay = est.prefill_stall_s(pending, pending_pairs) if pending or pending_pairs else 0.0
    if n1 > cap:
        delay += (n1 - cap) / cap * _slot_life(est, cap, acc, out, typical_out, life_s)
    if delay > 0:
        step = est.step_s(n1 if n1 < cap else cap)
        decode = out * step / acc
        gain -= acc / step * delay / (decode if decode > 0 else 1.0)
    if load and uncached:
        decode = out * est.step_s(n1) / acc
        gain -= before * est.prefill_stall_s(uncached, pairs) / (decode if decode > 0 else 1.0)
    return gain
