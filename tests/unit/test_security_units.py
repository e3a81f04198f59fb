"""The bounds and checks behind issue 36, unit by unit (no processes): ids, the door's posture, the
body budget, the retry budget, the response-owner map, the quarantine key, the extras and priority."""

from __future__ import annotations

import asyncio
import json

import pytest

from backends import BackendSpec, Strategy
from backends.client import SGLangClient
from gateway.auth import posture
from gateway.body_budget import BodyBudget, Reservation
from gateway.config import ConfigError, config_from_dict
from gateway.errors import ApiError, clip
from gateway.extras import check_extras
from gateway.principal import Principal
from gateway.response_ids import check_response_id, is_response_id
from gateway.response_owners import ResponseOwners
from gateway.retry_budget import RetryBudget
from gateway.suspects import body_fingerprint
from tests.support import Clock

BACKEND = {"name": "a", "url": "http://127.0.0.1:9", "model": "m"}


@pytest.mark.parametrize(
    "value,ok",
    [
        ("resp_0123456789abcdef0123456789abcdef", True),
        ("resp_a-b_C", True),
        ("resp_", False),
        ("resp_a/../x", False),
        ("resp_a%2Fx", False),
        ("resp_a.b", False),
        ("resp_" + "a" * 123, True),
        ("resp_" + "a" * 124, False),
        ("resp_a\n", False),
        ("msg_abc", False),
        (5, False),
    ],
)
def test_a_response_id_has_sglangs_shape(value, ok) -> None:
    assert is_response_id(value) is ok
    if not ok:
        with pytest.raises(ApiError) as e:
            check_response_id(value, "previous_response_id")
        assert e.value.status == 400 and e.value.param == "previous_response_id"
        assert len(e.value.message) < 400


def test_a_backend_call_cannot_climb_out_of_its_path() -> None:
    client = SGLangClient(BackendSpec(name="a", url="http://h/prefix", model="m", strategy=Strategy.AR))
    for segments in (["v1", ".."], ["v1", "."], ["v1", ""]):
        with pytest.raises(ValueError):
            asyncio.run(client.call("GET", segments))


def _config(listen: str, **auth: object) -> object:
    return config_from_dict({"gateway": {"listen": listen}, "auth": auth, "backends": [BACKEND]})


def test_the_doors_posture_follows_keys_and_the_listener(monkeypatch) -> None:
    monkeypatch.delenv("SPECROUTE_API_KEYS", raising=False)
    monkeypatch.delenv("SPECROUTE_ADMIN_KEY", raising=False)
    assert posture(_config("127.0.0.1:8000")).mode == "local"
    assert posture(_config("[::1]:8000")).mode == "local"
    assert posture(_config("localhost:8000")).admin
    with pytest.raises(ConfigError, match="allow_unauthenticated"):
        posture(_config("0.0.0.0:8000"))
    with pytest.raises(ConfigError):
        posture(_config("gateway.internal:8000"))  # a name may resolve anywhere
    opened = posture(_config("0.0.0.0:8000", allow_unauthenticated=True))
    assert opened.mode == "open" and not opened.admin and "UNAUTHENTICATED" in opened.message
    keyed = posture(_config("0.0.0.0:8000", api_keys=["k"]))
    assert keyed.mode == "keys" and not keyed.admin  # no admin key: closed, never an API key
    assert posture(_config("0.0.0.0:8000", api_keys=["k"], admin_key="a")).admin
    monkeypatch.setenv("SPECROUTE_API_KEYS", "from-env")
    assert posture(_config("0.0.0.0:8000")).mode == "keys"


def test_config_refuses_what_would_open_or_break_the_door() -> None:
    with pytest.raises(ConfigError, match="public_paths"):
        _config("127.0.0.1:1", public_paths=["/admin/backends"])
    with pytest.raises(ConfigError, match="priority_range"):
        _config("127.0.0.1:1", priority_range=[5, 1])
    with pytest.raises(ConfigError, match="key or key_env"):
        _config("127.0.0.1:1", clients=[{"name": "x"}])
    with pytest.raises(ConfigError, match="allowed_extras"):
        config_from_dict({"gateway": {"allowed_extras": ["temperature"]}, "backends": [BACKEND]})
    with pytest.raises(ConfigError, match="max_body_bytes_in_flight"):
        config_from_dict({"gateway": {"max_body_bytes": 10, "max_body_bytes_in_flight": 5}, "backends": [BACKEND]})


def test_the_body_budget_serves_waiters_in_order_and_a_cancelled_one_takes_nothing() -> None:
    async def run() -> list[str]:
        budget = BodyBudget(100)
        order: list[str] = []
        first = Reservation(budget)
        await first.reserve(80)

        async def wait(name: str, size: int) -> Reservation:
            r = Reservation(budget)
            await r.reserve(size)
            order.append(name)
            return r

        second = asyncio.create_task(wait("second", 50))
        cancelled = asyncio.create_task(wait("cancelled", 10))
        await asyncio.sleep(0)
        assert budget.used == 80 and not second.done()
        assert not Reservation(budget).grow(30)  # a chunked body cannot overrun it
        cancelled.cancel()
        await asyncio.sleep(0)
        first.release()
        first.release()  # once only
        got = await second
        assert budget.used == 50
        got.release()
        assert budget.used == 0
        return order

    assert asyncio.run(run()) == ["second"]


def test_the_retry_budget_allows_a_share_of_recent_requests() -> None:
    clock = Clock()
    budget = RetryBudget(0.2, 10, 0.5, clock)  # a floor of 5 retries per 10 s window
    for _ in range(100):
        budget.request()
    allowed = sum(budget.spend() for _ in range(100))
    assert allowed == 25  # 20% of 100, plus the floor
    clock.now = 11  # the window has passed: only the floor again
    assert sum(budget.spend() for _ in range(100)) == 5


def test_the_response_owner_map_is_bounded_in_bytes() -> None:
    owners = ResponseOwners(capacity=1_000_000, max_bytes=100_000)
    for i in range(10_000):
        owners.record(f"resp_{i:0120d}", "backend")
    assert owners.bytes <= 100_000 and 0 < len(owners) < 10_000
    assert owners.owner(f"resp_{9999:0120d}") == "backend" and owners.owner(f"resp_{0:0120d}") is None
    owners.record(f"resp_{9999:0120d}", "other")  # recorded again: counted once
    assert owners.bytes == sum(len(k) + len(v) + owners.ENTRY_OVERHEAD for k, v in owners._owners.items())


def test_the_quarantine_key_ignores_spacing_and_key_order() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "crash"}], "max_tokens": 5}
    compact = json.dumps(body, separators=(",", ":")).encode()
    spaced = json.dumps(body, indent=3).encode()
    reordered = json.dumps(dict(reversed(list(body.items())))).encode()
    assert body_fingerprint(compact) == body_fingerprint(spaced) == body_fingerprint(reordered)
    assert body_fingerprint(compact) != body_fingerprint(json.dumps({**body, "max_tokens": 6}).encode())


def test_guarded_extras_and_priority_ranges() -> None:
    check_extras(["model", "messages", "top_k", "ignore_eos"], frozenset())
    for field in ("custom_logit_processor", "return_hidden_states", "bootstrap_room", "rid", "data_parallel_rank"):
        with pytest.raises(ApiError) as e:
            check_extras(["model", field], frozenset())
        assert e.value.param == field
    check_extras(["bootstrap_host", "bootstrap_port"], frozenset({"bootstrap_*"}))
    check_extras(["rid"], frozenset({"rid"}))
    assert Principal("p", None).clamp_priority(99, 3) == 3
    assert Principal("p", (-5, 10)).clamp_priority(99, 0) == 10
    assert Principal("p", (-5, 10)).clamp_priority(-99, 0) == -5
    assert Principal("p", (-5, 10)).clamp_priority(7, 0) == 7


def test_a_clipped_string_says_how_long_it_was() -> None:
    assert clip("short") == "'short'"
    long = clip("x" * 1_000_000)
    assert len(long) < 120 and "1000000 characters" in long


def test_each_status_of_the_body_reader_names_one_counted_reason():
    from gateway.refusals import _BODY_READER, BODY_REASONS, STATUS

    # two body reasons on one status would make one of them uncountable
    assert sorted(BODY_REASONS.values()) == sorted(_BODY_READER)
    assert all(STATUS[reason] == status for status, reason in BODY_REASONS.items())
