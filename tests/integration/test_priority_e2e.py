"""The admission queue honours SGLang's `priority` field end to end: real processes (`specroute
sim`, `specroute serve`), the real `openai` SDK sending `priority` as SGLang's extra body field.

The gateway admits one request at a time; a stream holds the slot while four requests queue, one
after another, with different priorities. Once the holder leaves, the gateway dispatches them one
at a time, so the order of their records is the order the queue served them in.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator

import openai
import pytest

from tests.conftest import TEST_TIME_SCALE
from tests.support import (
    free_port,
    gateway,
    gateway_config,
    get_json,
    one_slot_gateway,
    open_stream,
    output,
    running,
    specroute,
    wait_until,
)

MSG = [{"role": "user", "content": "Write a long history of the Roman republic."}]

# Clients may set any priority (auth.priority_range; by default only the configured default goes).
ANY_PRIORITY = "[auth]\npriority_range = [-1000, 1000]\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen]]:
    with one_slot_gateway(tmp_path_factory.mktemp("priority"), TEST_TIME_SCALE) as (_twin, url, proc):
        yield url, proc


def test_queued_requests_are_served_by_priority(setup):
    url, proc = setup
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    # (priority, max_tokens): max_tokens tells the records apart (the twin always runs to its budget)
    queued = [(None, 11), (5, 12), (1, 13), (5, 14)]
    answers: dict[int, int] = {}

    def send(priority: int | None, max_tokens: int) -> None:
        extra = {} if priority is None else {"priority": priority}
        reply = client.chat.completions.create(
            model="kimi-k2.6", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, extra_body=extra
        )
        assert reply.usage is not None
        answers[max_tokens] = reply.usage.completion_tokens

    threads = []
    with open_stream(url, {"model": "kimi-k2.6", "messages": MSG, "max_tokens": 40_000, "stream": True}):
        for i, (priority, max_tokens) in enumerate(queued):
            threads.append(threading.Thread(target=send, args=(priority, max_tokens)))
            threads[-1].start()
            assert wait_until(lambda n=i + 1: get_json(f"{url}/admin/backends")["waiting"] == n), "not queued"
    # the holder has left: its slot passes down the queue
    for thread in threads:
        thread.join(60)
    assert answers == {11: 11, 12: 12, 13: 13, 14: 14}

    def served() -> list[dict]:
        records = [json.loads(line) for line in output(proc).splitlines() if line.startswith('{"ts"')]
        return [r for r in records if r.get("max_tokens") in answers and r.get("status") == 200]

    assert wait_until(lambda: len(served()) == len(queued))  # a record is written just after its answer
    # priority 5 twice (first come first served), then 1, then the default (0)
    assert [r["max_tokens"] for r in served()] == [12, 14, 13, 11]
    assert [r.get("priority") for r in served()] == [5, 5, 1, None]  # the access log says what was asked


def test_a_priority_one_server_refuses_is_answered_by_another(tmp_path):
    """SGLang under `--abort-on-priority-when-disabled` aborts a request carrying a priority with
    503: the gateway retries it elsewhere as a busy answer, streamed or not; where every backend
    refuses it, the client gets SGLang's 503 and message."""
    refusing, plain = free_port(), free_port()
    twins = [
        specroute("sim", "--profile", "k26-ar", "--port", str(p), "--time-scale", TEST_TIME_SCALE, *flags)
        for p, flags in ((refusing, ("--abort-on-priority-when-disabled",)), (plain, ()))
    ]
    entry = {"model": "kimi-k2.6", "strategy": "ar"}
    with (
        running(twins[0], ready_url=f"http://127.0.0.1:{refusing}/ready", timeout=60),
        running(twins[1], ready_url=f"http://127.0.0.1:{plain}/ready", timeout=60),
    ):
        both = [
            {"name": "refusing", "url": f"http://127.0.0.1:{refusing}", **entry},
            {"name": "plain", "url": f"http://127.0.0.1:{plain}", **entry},
        ]
        policy = '[models."kimi-k2.6"]\npolicy = "round_robin"\n' + ANY_PRIORITY
        with gateway(tmp_path, both, policy) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            served = []
            for stream in (False, True, False, True):  # round robin: half of them go to `refusing` first
                raw = client.chat.completions.with_raw_response.create(
                    model="kimi-k2.6",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    stream=stream,
                    extra_body={"priority": 3},
                )
                served.append(raw.headers["x-specroute-backend"])
                if stream:  # a whole stream, not its error frame
                    body = raw.http_response.read()
                    assert b'"error"' not in body and b'"choices"' in body and body.rstrip().endswith(b"data: [DONE]")
            assert served == ["plain"] * 4
            assert get_json(f"{url}/admin/backends")["retries"] >= 2  # refused there first, then retried
        with gateway(tmp_path, both[:1], ANY_PRIORITY) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                client.chat.completions.create(
                    model="kimi-k2.6", messages=[{"role": "user", "content": "hi"}], extra_body={"priority": 3}
                )
            assert refused.value.status_code == 503 and "priority is disabled" in refused.value.message
            plain_answer = client.chat.completions.create(
                model="kimi-k2.6", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert plain_answer.usage is not None and plain_answer.usage.completion_tokens == 4


def test_a_server_scheduling_priorities_the_other_way_is_shown_and_warned_of(tmp_path):
    """A twin run with SGLang's --enable-priority-scheduling --schedule-low-priority-values-first
    behind a gateway whose queue serves high values first: /admin/backends shows each server's
    order, and the gateway warns that the two layers disagree; a server in the gateway's order
    draws no warning."""
    low, high = free_port(), free_port()
    flags = {low: ("--schedule-low-priority-values-first",), high: ()}
    twins = [
        specroute(
            "sim", "--profile", "k26-ar", "--port", str(p), "--time-scale", TEST_TIME_SCALE,
            "--enable-priority-scheduling", "--default-priority-value", "0", *flags[p],
        )
        for p in (low, high)
    ]  # fmt: skip
    config = tmp_path / "gateway.toml"
    port = free_port()
    entry = {"model": "kimi-k2.6", "strategy": "ar"}
    backends = [
        {"name": "low", "url": f"http://127.0.0.1:{low}", **entry},
        {"name": "high", "url": f"http://127.0.0.1:{high}", **entry},
    ]
    config.write_text(gateway_config(port, backends))
    url = f"http://127.0.0.1:{port}"
    with (
        running(twins[0], ready_url=f"http://127.0.0.1:{low}/ready", timeout=60),
        running(twins[1], ready_url=f"http://127.0.0.1:{high}/ready", timeout=60),
        running(specroute("serve", "--config", str(config)), ready_url=f"{url}/health") as proc,
    ):

        def orders() -> dict[str, object]:
            state = get_json(f"{url}/admin/backends")["backends"]
            return {b["name"]: (b["server_info"] or {}).get("priority_order") for b in state}

        assert wait_until(lambda: orders() == {"low": "low_first", "high": "high_first"}), orders()
        assert wait_until(lambda: "backend low schedules priority low_first" in output(proc))
        assert "backend high schedules" not in output(proc)
