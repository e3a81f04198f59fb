"""Over HTTP: a short answer overflows from a speculative server whose queue (other clients'
requests beyond its cap, as its /v1/loads reports them) would hold it for longer than its slot
life allows, to the AR server beside it; while that server has room it stays there."""

from __future__ import annotations

import threading

import openai

from tests.support import gateway, get_json, wait_until

MODEL = "kimi-k2.6"
HELLO = [{"role": "user", "content": "Say hello."}]


def _served_by(client: openai.OpenAI, max_tokens: int, **extra: object) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=HELLO, max_tokens=max_tokens, temperature=0.0, extra_body=extra or None
    )
    return raw.headers["x-specroute-backend"]


def test_a_short_answer_leaves_a_full_speculative_servers_queue_for_ar(tmp_path, twin_factory):
    # real time (scale 1): the slot life the gateway measures is in the step times' own seconds
    dflash = twin_factory("k26-dflash", "--time-scale", "1.0", "--max-running-requests", "2")
    ar = twin_factory("k26-ar", "--time-scale", "1.0")
    backends = [
        {"name": "dflash", "url": dflash, "model": MODEL, "strategy": "dflash"},
        {"name": "ar", "url": ar, "model": MODEL, "strategy": "ar"},
    ]
    no_exploring = f'[models."{MODEL}"]\nepsilon = 0.0\n'
    with gateway(tmp_path, backends, no_exploring, env={"SPECROUTE_MEASURE_BACKENDS": "0"}) as gw:
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        assert _served_by(client, 16) == "dflash"  # idle: four tokens a pass
        # a 600-token answer there: the gateway measures how long a request holds a slot (~5 s)
        assert _served_by(client, 600, ignore_eos=True) == "dflash"

        # another gateway's clients fill it: two running at its cap of 2, three waiting (the server
        # answers a waiting request's headers when it starts it: each client streams in a thread)
        other = openai.OpenAI(base_url=f"{dflash}/v1", api_key="x", max_retries=0)
        stop = threading.Event()

        def occupy() -> None:
            stream = other.chat.completions.create(
                model=MODEL, messages=HELLO, max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
            )
            with stream:
                for _ in stream:
                    if stop.is_set():
                        break

        clients = [threading.Thread(target=occupy, daemon=True) for _ in range(5)]
        for t in clients:
            t.start()
        try:

            def load() -> int:
                return int(get_json(f"{gw}/admin/backends")["policies"][MODEL]["backends"]["dflash"]["load"])

            assert wait_until(lambda: load() >= 5, timeout=15)  # polled from its /v1/loads
            # fourth in line behind two slots that free every ~5 s: ~10 s, past the 5 s SLO; the
            # AR server answers 16 tokens in under a second
            assert _served_by(client, 16) == "ar"
        finally:
            stop.set()
            for t in clients:
                t.join(60)
