"""`specroute config init --from-profiles ...` and `specroute config check`."""

from __future__ import annotations

import json
import urllib.request

from gateway.config import load_config
from tests.support import free_port, running, specroute
from tools.cli_config import main as config_main
from tools.launch import load_recipe


def test_init_writes_a_config_that_loads(tmp_path, capsys):
    out = tmp_path / "etc" / "specroute.toml"
    code = config_main(
        [
            "init",
            "--from-profiles",
            "k26-ar=http://gpu-a:30000,k26-dflash=http://gpu-b:30000/",
            "--from-profiles",
            "qwen36-ddtree-b15=http://gpu-c:30000,dflash-2:k26-dflash=https://gpu-d",
            "--listen",
            "0.0.0.0:8000",
            "--policy",
            "goodput",
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    config = load_config(out)
    assert config.gateway.listen == "0.0.0.0:8000" and config.gateway.policy == "goodput"
    got = [(b.name, b.url, b.model, b.strategy) for b in config.backends]
    assert got == [
        ("k26-ar", "http://gpu-a:30000", "kimi-k2.6", "ar"),
        ("k26-dflash", "http://gpu-b:30000", "kimi-k2.6", "dflash"),
        ("qwen36-ddtree-b15", "http://gpu-c:30000", "qwen3.6-27b", "ddtree"),
        ("dflash-2", "https://gpu-d", "kimi-k2.6", "dflash"),
    ]
    for b in config.backends[:3]:  # the served model is the recipe's --served-model-name: no rewrite needed
        assert load_recipe(b.name).served_model_name == b.model and b.served_name is None
    assert "specroute backends show k26-dflash" in out.read_text()
    assert config_main(["check", str(out)]) == 0
    assert "kimi-k2.6: k26-ar (ar), k26-dflash (dflash), dflash-2 (dflash)" in capsys.readouterr().out


def test_init_to_stdout_with_tracing_and_twin_profiles(capsys, tmp_path):
    assert (
        config_main(
            ["init", "--from-profiles", "qwen36-ddtree-b64=http://127.0.0.1:1", "--otlp-endpoint", "http://jaeger:4318"]
        )
        == 0
    )
    text = capsys.readouterr().out
    path = tmp_path / "c.toml"
    path.write_text(text)
    config = load_config(path)
    assert (config.backends[0].model, config.backends[0].strategy) == ("qwen3.6-27b", "ddtree")
    assert (config.tracing.exporter, config.tracing.endpoint) == ("otlp", "http://jaeger:4318")


def test_init_refuses_bad_input_with_one_line(tmp_path, capsys):
    existing = tmp_path / "x.toml"
    existing.write_text("# keep me\n")
    cases = [
        ["init", "--from-profiles", "no-such=http://a:1"],
        ["init", "--from-profiles", "k26-ar=gpu-a:30000"],
        ["init", "--from-profiles", "k26-ar"],
        ["init", "--from-profiles", "k26-ar=http://a:1,k26-ar=http://b:1"],
        ["init", "--from-profiles", "k26-ar=http://a:1", "--policy", "fastest"],
        ["init", "--from-profiles", "k26-ar=http://a:1", "--output", str(existing)],
    ]
    for argv in cases:
        assert config_main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert existing.read_text() == "# keep me\n"
    bad = tmp_path / "bad.toml"
    bad.write_text('[gateway]\nlisten = "nowhere"\n')
    assert config_main(["check", str(bad)]) == 2
    assert "gateway.listen" in capsys.readouterr().err


def test_init_config_serves_through_a_twin(tmp_path, twin_factory):
    """The generated file is a working gateway config: serve it, send one request through it."""
    url = twin_factory("k26-eagle3")
    port = free_port()
    path = tmp_path / "gw.toml"
    assert (
        config_main(["init", "--from-profiles", f"k26-eagle3={url}", "--listen", f"127.0.0.1:{port}", "-o", str(path)])
        == 0
    )
    base = f"http://127.0.0.1:{port}"
    with running(specroute("serve", "--config", str(path)), ready_url=f"{base}/ready", timeout=60):
        body = json.dumps(
            {"model": "kimi-k2.6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        req = urllib.request.Request(
            f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=20) as r:
            assert r.headers["x-specroute-backend"] == "k26-eagle3"
            assert json.loads(r.read())["usage"]["completion_tokens"] == 8
