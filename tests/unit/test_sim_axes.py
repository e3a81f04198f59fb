"""The engine's new axes, on a virtual clock: prefix cache, chunked prefill, temperature, context
length, natural stops, reasoning lengths and SGLang's three forms of acceptance statistics."""

from __future__ import annotations

import pytest

from twin.engine import DECODE_LOG_INTERVAL, MAX_PREFILL_TOKENS, Engine
from twin.prefix_cache import PREFIX_BLOCK_TOKENS, PrefixCache, chain_from_text, chain_from_tokens
from twin.profile import load_profile
from twin.thinking import reasoning_tokens
from twin.virtual import run_closed_loop


def _drain(engine: Engine) -> float:
    t = 0.0
    while not engine.idle:
        t += engine.step().duration_s
    return t


def _ttft(engine: Engine, rid: str, prompt: int, **kw) -> float:
    """Simulated seconds from submit to the request's first token, alone on the engine."""
    engine.submit(rid, prompt, 4, **kw)
    t = 0.0
    while True:
        res = engine.step()
        t += res.duration_s
        if any(em.rid == rid for em in res.emissions):
            _drain(engine)
            return t


# ------------------------------------------------------------------ hash chains and LRU


def test_chains_share_exactly_their_common_prefix():
    a = chain_from_tokens(640, "conv-1")
    b = chain_from_tokens(1280, "turn-2", parent=a)
    assert len(a) == 10 and len(b) == 20 and b[:10] == a
    assert chain_from_tokens(640, "conv-2")[0] != a[0]
    text = "x" * 1000
    assert len(chain_from_text(text)) == 1000 // (PREFIX_BLOCK_TOKENS * 4)
    assert chain_from_text(text + "tail")[:3] == chain_from_text(text)[:3]
    assert chain_from_text("y" + text)[0] != chain_from_text(text)[0]


def test_lru_evicts_leaves_never_orphans():
    cache = PrefixCache(capacity_tokens=6 * PREFIX_BLOCK_TOKENS)
    trunk = chain_from_tokens(4 * PREFIX_BLOCK_TOKENS, "t")
    branch = chain_from_tokens(6 * PREFIX_BLOCK_TOKENS, "b", parent=trunk)
    cache.insert(branch)
    assert cache.match(branch) == 6
    other = chain_from_tokens(2 * PREFIX_BLOCK_TOKENS, "o")
    cache.insert(other)  # two blocks must go: the branch's leaves, not the shared trunk
    assert cache.match(other) == 2
    assert cache.match(branch) == 4 and cache.match(trunk) == 4
    assert cache.num_tokens <= cache.capacity_tokens


# ------------------------------------------------------------------- engine: prefix cache


def test_cached_prefix_skips_prefill_and_reports_cached_tokens():
    prof = load_profile("k26-dflash")
    history = chain_from_tokens(20_000, "session")
    cold = Engine(prof)
    t_cold = _ttft(cold, "a", 20_000, prefix_blocks=history)
    warm = Engine(prof)
    warm.submit("a", 20_000, 4, prefix_blocks=history)
    _drain(warm)
    req = warm.submit("b", 20_000, 4, prefix_blocks=history)
    t_warm = _ttft(warm, "b2", 20_000, prefix_blocks=history)
    assert t_warm < t_cold / 10
    _drain(warm)
    assert req.cached_tokens == 20_000 - 1 or req.cached_tokens == (20_000 // 64) * 64
    assert req.cached_tokens < req.prompt_tokens  # at least one token is always prefilled
    st = warm.stats()
    assert st.total_cached_tokens >= 2 * req.cached_tokens
    assert 0.6 < st.lifetime_cache_hit_rate < 0.7  # 2 of 3 prompts hit
    assert st.cache_hit_rate > 0.99  # the last prefill batch hit


def test_cache_output_makes_the_next_turn_hit():
    e = Engine(load_profile("k26-ar"))
    turn1 = chain_from_tokens(3_000, "c")
    r1 = e.submit("t1", 3_000, 500, prefix_blocks=turn1)
    _drain(e)
    assert r1.cached_tokens == 0
    answered = chain_from_tokens(3_000 + 500, "c-answer", parent=turn1)
    assert e.cache_output(answered) == len(answered) - len(turn1)
    turn2 = chain_from_tokens(3_500 + 200, "c-turn2", parent=answered)
    r2 = e.submit("t2", 3_700, 10, prefix_blocks=turn2)
    _drain(e)
    assert r2.cached_tokens == len(answered) * PREFIX_BLOCK_TOKENS


def test_cache_is_bounded_by_the_kv_pool():
    prof = load_profile("k26-ar")
    e = Engine(prof)
    for i in range(12):
        e.submit(f"r{i}", 60_000, 2, prefix_blocks=chain_from_tokens(60_000, i))
        _drain(e)
    assert e.cache.num_tokens <= prof.max_total_num_tokens
    # the oldest conversations were evicted, the newest is still there
    assert e.cache.match(chain_from_tokens(60_000, 0)) == 0
    assert e.cache.match(chain_from_tokens(60_000, 11)) == 60_000 // PREFIX_BLOCK_TOKENS


# ----------------------------------------------------------------- engine: chunked prefill


def test_long_prompt_prefills_in_chunks_while_others_decode():
    e = Engine(load_profile("k26-ar"))
    e.submit("short", 50, 400)
    e.step()
    long = e.submit("long", 3 * MAX_PREFILL_TOKENS, 5)
    steps_until_first = 0
    short_tokens = 0
    while long.completion_tokens == 0:
        res = e.step()
        steps_until_first += 1
        short_tokens += sum(em.n_tokens for em in res.emissions if em.rid == "short")
    assert steps_until_first == 3  # one chunk of MAX_PREFILL_TOKENS per step
    assert short_tokens == 3  # the running request kept decoding meanwhile
    _drain(e)


def test_long_uncached_history_ttft_is_seconds():
    # K2.6 TP8 on PCIe: ~0.12 ms per prompt token plus attention pairs (profile provenance)
    t = _ttft(Engine(load_profile("k26-dflash")), "a", 32_768)
    assert 3.5 < t < 6.0


# ------------------------------------------------------------ engine: temperature, context


@pytest.mark.parametrize("name", ["k26-dflash", "k26-ddtree", "k26-eagle3", "qwen36-ddtree-b15"])
def test_acceptance_falls_with_temperature(name):
    prof = load_profile(name)
    lengths = [run_closed_loop(prof, 4, 16, 256, domain="math", temperature=t).accept_length for t in (0.0, 0.7, 1.0)]
    assert lengths[0] > lengths[1] > lengths[2]
    assert lengths[2] > 0.75 * lengths[0]  # the published drop is ~5-15%, not a collapse


def test_temperature_effect_is_smaller_for_chat_and_top_p_softens_it():
    e = Engine(load_profile("k26-dflash"))
    drop = {d: 1 - e.accept_prob(d, 7, temperature=1.0) / e.accept_prob(d, 7) for d in ("math", "chat")}
    assert drop["math"] > 0 and drop["chat"] > 0
    assert e.accept_prob("math", 7, temperature=1.0, top_p=0.5) > e.accept_prob("math", 7, temperature=1.0)
    assert load_profile("k26-ar").temperature is None
    with pytest.raises(ValueError, match="temperature"):
        e.submit("x", 10, 10, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        e.submit("y", 10, 10, top_p=0.0)


def test_step_time_grows_with_kv_tokens():
    e = Engine(load_profile("k26-ar"))
    short = e.step_time(8, kv_tokens=8 * 500)
    long = e.step_time(8, kv_tokens=8 * 60_000)
    # 8 x 59.5k extra tokens x 56 ns = 26.7 ms more per step
    assert long - short == pytest.approx(8 * 59_500 * 56e-9, rel=1e-6)


def test_long_context_decodes_slower_and_dflash_accepts_less_beyond_its_window():
    prof = load_profile("k26-dflash")
    short = run_closed_loop(prof, 4, 8, 256, domain="code", prompt_tokens=1_000)
    long = run_closed_loop(prof, 4, 8, 256, domain="code", prompt_tokens=60_000)
    assert long.accept_length < short.accept_length
    assert long.mean_step_s > short.mean_step_s
    ar = load_profile("k26-ar")
    e = Engine(prof)
    assert e.accept_prob("code", 3, context_tokens=4_000) == e.accept_prob("code", 3)
    assert e.accept_prob("code", 3, context_tokens=16_000) < e.accept_prob("code", 3)
    assert ar.speculative is None


# ------------------------------------------------------------------ natural stop, thinking


def test_stop_after_tokens_finishes_with_stop():
    e = Engine(load_profile("k26-dflash"))
    r = e.submit("a", 20, 500, stop_after_tokens=37)
    finals = []
    while not e.idle:
        finals += [em for em in e.step().emissions if em.finished]
    assert r.completion_tokens == 37 and r.finish_reason == "stop"
    assert finals[0].finish_reason == "stop"
    r2 = e.submit("b", 20, 30, stop_after_tokens=99)
    _drain(e)
    assert r2.completion_tokens == 30 and r2.finish_reason == "length"


def test_reasoning_lengths_are_deterministic_and_ordered_by_domain():
    model = load_profile("k26-dflash").reasoning
    assert model is not None and model.parser == "kimi_k2"
    keys = range(1, 400)
    mean = {d: sum(reasoning_tokens(model, d, k) for k in keys) / len(keys) for d in ("math", "code", "chat")}
    assert mean["math"] > mean["code"] > mean["chat"] > 0
    assert reasoning_tokens(model, "math", 5) == reasoning_tokens(model, "math", 5)
    assert len({reasoning_tokens(model, "math", k) for k in keys}) > 100
    assert reasoning_tokens(load_profile("qwen36-ar").reasoning, "math", 5) == 0


# ----------------------------------------------------------- lifetime vs windowed acceptance


def test_lifetime_accept_length_is_published_every_interval_and_dilutes_a_drop():
    e = Engine(load_profile("k26-dflash"))
    assert e.stats().lifetime_accept_length is None
    for i in range(8):
        e.submit(f"r{i}", 30, 4000, "Solve 2 + 2 = x")
    for _ in range(DECODE_LOG_INTERVAL):  # the first step only prefills: 39 decode steps
        e.step()
    st = e.stats()
    assert st.lifetime_accept_length is None and st.accept_length == 0.0  # not published yet
    e.step()
    st = e.stats()
    assert st.lifetime_accept_length == pytest.approx(st.accept_length)
    for _ in range(10 * DECODE_LOG_INTERVAL):
        e.step()
    before = e.stats()
    e.accept_scale = 0.5
    for _ in range(2 * DECODE_LOG_INTERVAL):
        e.step()
    after = e.stats()
    # the windowed gauge sees the drop at once, the lifetime average only a fraction of it
    assert after.accept_length < 0.8 * before.accept_length
    assert after.lifetime_accept_length > 0.9 * before.lifetime_accept_length
    assert load_profile("k26-ar").is_speculative is False
    ar = Engine(load_profile("k26-ar"))
    ar.submit("a", 10, 100)
    _drain(ar)
    assert ar.stats().lifetime_accept_length is None
