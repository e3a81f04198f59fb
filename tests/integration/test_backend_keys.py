"""A backend's upstream key (SGLang's --api-key) from an environment variable: `api_key_env`.

The config names the variable; the key is read when the config is loaded and sent upstream as
`Authorization: Bearer`, on requests and on the poller's probes alike. A variable that is unset or
empty is a config error naming the backend and the variable (the upstream would answer 401 to
everything).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gateway.config import ConfigError, config_from_dict, load_config
from tests.support import gateway, gateway_config, running, specroute
from tools.processes import free_port

ENTRY = {"name": "a", "url": "http://127.0.0.1:30000", "model": "m"}


def _load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **entry: str) -> str | None:
    for name in ("UPSTREAM_KEY", "OTHER_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = config_from_dict({"backends": [{**ENTRY, **entry}]}, "specroute.toml")
    return config.backend_specs()[0].api_key


def test_the_key_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load(monkeypatch, {"UPSTREAM_KEY": "sk-up"}, api_key_env="UPSTREAM_KEY") == "sk-up"
    # a key file mounted from a Secret often ends in a newline: not part of the key
    assert _load(monkeypatch, {"UPSTREAM_KEY": "sk-up\n"}, api_key_env="UPSTREAM_KEY") == "sk-up"
    assert _load(monkeypatch, {}, api_key="plain") == "plain"
    assert _load(monkeypatch, {}) is None


@pytest.mark.parametrize(
    ("env", "entry", "expected"),
    [
        (
            {},
            {"api_key_env": "UPSTREAM_KEY"},
            "backends[0].api_key_env: the environment variable UPSTREAM_KEY is not set",
        ),
        ({"UPSTREAM_KEY": " \n"}, {"api_key_env": "UPSTREAM_KEY"}, "UPSTREAM_KEY is empty"),
        (
            {"UPSTREAM_KEY": "k"},
            {"api_key_env": "UPSTREAM_KEY", "api_key": "k"},
            "backends[0]: expected at most one of api_key and api_key_env",
        ),
        ({}, {"api_key_env": "9-lives"}, "backends[0].api_key_env: expected an environment variable name"),
        ({}, {"api_key": ""}, "backends[0].api_key: expected a non-empty key"),
    ],
)
def test_bad_key_settings_name_the_backend_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], entry: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(monkeypatch, env, **entry)
    assert str(info.value).startswith("specroute.toml: ") and expected in str(info.value)


def test_the_gateway_sends_the_key_from_the_environment_upstream(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "fake.jsonl"
    fake = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "tests.fake_sglang", "--port", str(port), "--log", str(log), "--model", "m"]
    entry = {"name": "a", "url": fake, "model": "m", "strategy": "ar", "api_key_env": "SGLANG_A_KEY"}
    with (
        running(cmd, ready_url=f"{fake}/ready"),
        gateway(tmp_path, [entry], env={"SGLANG_A_KEY": "sk-from-secret"}) as url,
    ):
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    from_gateway = [r for r in seen if r.get("via")]
    assert any(r["path"] == "/v1/chat/completions" for r in from_gateway)
    assert {r["authorization"] for r in from_gateway} == {"Bearer sk-from-secret"}


def test_an_unset_variable_stops_the_gateway_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "specroute.toml"
    entry = {"name": "a", "url": "http://127.0.0.1:30000", "model": "m", "api_key_env": "SPECROUTE_TEST_NO_SUCH_KEY"}
    path.write_text(gateway_config(free_port(), [entry]))
    with pytest.raises(ConfigError):
        load_config(path)
    proc = subprocess.run(specroute("serve", "--config", str(path)), capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "backends[0].api_key_env" in lines[0] and "SPECROUTE_TEST_NO_SUCH_KEY is not set" in lines[0]
