"""The Responses API through the gateway, with the real `openai` SDK and twins that serve SGLang's
`/v1/responses`: answers and streams relayed as SGLang sends them, and stored Responses followed:
a `previous_response_id`, `responses.retrieve` and `cancel` go to the backend that stored it,
whatever the policy would choose."""

from __future__ import annotations

import urllib.request

import openai
import pytest

from tests.support import gateway, get_json, wait_until

ROUND_ROBIN = 'policy = "round_robin"\n'  # a policy that would move every follow-up if it could


def _stored_backends(twin_factory) -> list[dict]:
    a = twin_factory("k26-dflash", "--enable-response-store")
    b = twin_factory("k26-eagle3", "--enable-response-store")
    return [
        {"name": "a", "url": a, "model": "kimi-k2.6", "strategy": "dflash"},
        {"name": "b", "url": b, "model": "kimi-k2.6", "strategy": "eagle3"},
    ]


@pytest.fixture
def stored_pair(tmp_path, twin_factory):
    with gateway(tmp_path, _stored_backends(twin_factory), gateway_keys=ROUND_ROBIN) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)


def test_a_replica_that_did_not_relay_a_response_finds_it_on_its_backend(tmp_path, twin_factory):
    """Two gateway replicas over the same backends (or one, restarted): the second has no record of
    what the first relayed, and finds it where it is stored for retrieve, follow-ups and cancel."""
    backends = _stored_backends(twin_factory)
    with (
        gateway(tmp_path, backends, gateway_keys=ROUND_ROBIN) as one,
        gateway(tmp_path, backends, gateway_keys=ROUND_ROBIN) as two,
    ):
        assert wait_until(lambda: all(b["ready"] for b in get_json(f"{two}/admin/backends")["backends"]))
        first = openai.OpenAI(base_url=f"{one}/v1", api_key="x", max_retries=0, timeout=30)
        second = openai.OpenAI(base_url=f"{two}/v1", api_key="x", max_retries=0, timeout=30)
        raws = [
            first.responses.with_raw_response.create(model="kimi-k2.6", input=f"Hi {i}.", max_output_tokens=4)
            for i in range(2)
        ]
        held = {r.parse().id: r.headers["x-specroute-backend"] for r in raws}
        assert set(held.values()) == {"a", "b"}  # round robin: one on each
        for rid, holder in held.items():
            got = second.responses.with_raw_response.retrieve(rid)
            assert got.parse().id == rid and got.headers["x-specroute-backend"] == holder
        for rid, holder in held.items():  # follow-ups the second replica's round robin would move
            for _ in range(2):
                raw = second.responses.with_raw_response.create(
                    model="kimi-k2.6", input="And then?", previous_response_id=rid, max_output_tokens=4
                )
                assert raw.headers["x-specroute-backend"] == holder
        background = first.responses.with_raw_response.create(
            model="kimi-k2.6", input="A long essay.", max_output_tokens=4000, background=True
        )
        cancelled = second.responses.with_raw_response.cancel(background.parse().id)
        assert cancelled.headers["x-specroute-backend"] == background.headers["x-specroute-backend"]
        assert cancelled.parse().status == "cancelled"
        with pytest.raises(openai.NotFoundError) as missing:
            second.responses.retrieve("resp_held_nowhere")
        with pytest.raises(openai.BadRequestError) as invalid:
            second.responses.retrieve("not-a-response-id")
    assert missing.value.body["code"] == "response_not_found"
    assert invalid.value.body["param"] == "response_id" and "begins with 'resp'" in invalid.value.body["message"]


def test_a_response_and_a_stream_through_the_gateway(stored_pair):
    client = stored_pair
    raw = client.responses.with_raw_response.create(model="kimi-k2.6", input="Say hello.", max_output_tokens=8)
    response = raw.parse()
    assert raw.headers["x-specroute-backend"] in {"a", "b"}
    # SGLang keeps 2 of max_output_tokens as headroom; the twin always runs to its budget
    assert response.status == "incomplete" and response.usage.output_tokens == 6 and response.output_text

    events = list(client.responses.create(model="kimi-k2.6", input="Count to five.", max_output_tokens=12, stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in {"response.completed", "response.incomplete"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.usage.output_tokens == 10


def test_follow_ups_go_to_the_backend_that_stored_the_previous_response(stored_pair):
    client = stored_pair
    raw = client.responses.with_raw_response.create(
        model="kimi-k2.6", input="Remember: the code is 7.", max_output_tokens=4
    )
    first, holder = raw.parse(), raw.headers["x-specroute-backend"]
    previous = first.id
    for turn in range(4):  # round robin alternates; each follow-up must stay where its history is
        stream = turn % 2 == 1
        raw = client.responses.with_raw_response.create(
            model="kimi-k2.6",
            input=f"Turn {turn}: what is the code?",
            previous_response_id=previous,
            max_output_tokens=4,
            stream=stream,
        )
        assert raw.headers["x-specroute-backend"] == holder
        if stream:
            events = list(raw.parse())
            previous = events[-1].response.id
        else:
            previous = raw.parse().id
    stored = client.responses.retrieve(previous)
    assert stored.id == previous and stored.previous_response_id
    # a new Response may not take a known one's id: its owner would move, and its follow-ups with it
    with pytest.raises(openai.ConflictError) as taken:
        client.responses.create(
            model="kimi-k2.6", input="Mine now.", max_output_tokens=2, extra_body={"request_id": previous}
        )
    assert taken.value.body["param"] == "request_id" and taken.value.body["code"] == "response_exists"
    assert client.responses.with_raw_response.retrieve(previous).headers["x-specroute-backend"] == holder
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_unknown")
    assert e.value.body["code"] == "response_not_found"
    # a Response not stored is not remembered: its id is as unknown as any other
    unstored = client.responses.create(model="kimi-k2.6", input="Forget me.", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_full_queue_on_the_responses_route_is_retried_elsewhere(tmp_path, twin_factory):
    """SGLang's Responses API disguises a full queue: a 400 whose message is "503: The request
    queue is full." when not streamed, a `response.failed` before any token when streamed. Both
    are busy, not bad requests: the gateway tries another backend and the client never sees them."""
    full = twin_factory("k26-ar", "--max-queued-requests", "0")
    spare = twin_factory("k26-ar")
    backends = [
        {"name": "full", "url": full, "model": "kimi-k2.6", "strategy": "ar"},
        {"name": "spare", "url": spare, "model": "kimi-k2.6", "strategy": "ar"},
    ]
    with gateway(tmp_path, backends, gateway_keys=ROUND_ROBIN) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        for i in range(6):
            raw = client.responses.with_raw_response.create(
                model="kimi-k2.6", input=f"Question {i}?", max_output_tokens=6, stream=i % 2 == 1
            )
            assert raw.headers["x-specroute-backend"] == "spare"
            if i % 2:
                assert list(raw.parse())[-1].type == "response.incomplete"
            else:
                assert raw.parse().usage.output_tokens == 4
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    assert 'specroute_upstream_errors_total{backend="full",kind="http_503"}' in metrics
    assert 'specroute_upstream_errors_total{backend="full",kind="stream_503"}' in metrics


def test_a_background_response_is_cancelled_where_it_runs(stored_pair):
    client = stored_pair
    raw = client.responses.with_raw_response.create(
        model="kimi-k2.6", input="Write a long essay.", max_output_tokens=4000, background=True, store=True
    )
    queued, holder = raw.parse(), raw.headers["x-specroute-backend"]
    assert queued.status in {"queued", "in_progress"}
    cancelled = client.responses.with_raw_response.cancel(queued.id)
    assert cancelled.headers["x-specroute-backend"] == holder and cancelled.parse().status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"


def test_a_background_response_counts_in_flight_until_it_is_done(tmp_path, twin_factory):
    """SGLang answers `background: true` at once and generates afterwards: the gateway holds a slot
    on that backend (admission) until the Response's status is final, here its cancellation."""
    with gateway(tmp_path, _stored_backends(twin_factory), gateway_keys=ROUND_ROBIN) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        raw = client.responses.with_raw_response.create(
            model="kimi-k2.6", input="Write a long essay.", max_output_tokens=4000, background=True
        )
        queued, holder = raw.parse(), raw.headers["x-specroute-backend"]

        def inflight() -> dict[str, int]:
            return {b["name"]: b["inflight"] for b in get_json(f"{url}/admin/backends")["backends"]}

        held = inflight()
        client.responses.cancel(queued.id)
        assert wait_until(lambda: inflight()[holder] == 0)
        assert get_json(f"{url}/admin/backends")["inflight"] == 0
    assert held[holder] == 1 and sum(held.values()) == 1
