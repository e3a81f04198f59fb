"""`specroute config init --from-urls`: any SGLang server, read and classified by what it reports.

The algorithm names come from SGLang 0.5.23's own source (the wheel, read with ast: every
`SpeculativeAlgorithm` member and the reserved NEXTN alias) and from the DDTree pull request's flag
list. Servers are twins of each strategy the twin simulates (and its 0.5.9 compatibility mode),
and for the algorithms it does not simulate a small HTTP server answering `/server_info` as SGLang
would with that algorithm resolved.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from backends import Strategy
from gateway.config import load_config
from tests.integration.test_sim_server import twin
from tests.support import free_port
from tools.cli_config import main as config_main
from tools.fit.algorithms import classify, verify_width
from tools.launch.sglang_args import WheelUnavailable, ddtree_pr_extension, ensure_wheel, spec_from_wheel


@pytest.fixture(scope="module")
def sglang_algorithms() -> list[str]:
    try:
        spec = spec_from_wheel(ensure_wheel())
    except WheelUnavailable as e:
        pytest.skip(f"PyPI unreachable, cannot read SGLang's algorithms: {e}")
    choices = spec.flags["--speculative-algorithm"].choices
    assert choices is not None
    return list(choices)


def test_every_algorithm_sglang_reports_has_a_strategy_or_a_reason(sglang_algorithms):
    names = [*sglang_algorithms, *ddtree_pr_extension()[1]]
    # the wheel's list is what the parser found: the built-ins this module names are all in it
    assert {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DDTREE"} <= set(names)
    strategies = {s.value for s in Strategy}
    for name in names:
        c = classify(name)
        assert c.reported == name and c.why
        if c.strategy is None:  # only NGRAM, on a gateway built before its strategy
            assert name == "NGRAM" and "ngram" not in strategies, name
        else:
            assert c.strategy in strategies and c.twin_algorithm in ("EAGLE3", "DFLASH", "DDTREE", "NGRAM"), name
    assert classify(None).strategy == "ar" and classify("None").strategy == "ar"
    assert classify("eagle3").strategy == "eagle3"  # as an older release reports what it was given
    assert classify("MTP").strategy == "eagle3"


def test_a_plugin_algorithm_is_not_guessed():
    c = classify("MY_SPEC")
    assert c.strategy is None and "plugin" in c.why and "by hand" in c.why
    assert classify(42).strategy is None


def test_verify_width_per_algorithm():
    assert verify_width({"speculative_algorithm": None}) == 1
    assert verify_width({"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8}) == 8
    info = {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 32, "speculative_num_draft_tokens": 33}
    assert verify_width(info) == 33
    assert verify_width({"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4}) == 4
    assert verify_width({"speculative_algorithm": "EAGLE3"}) is None  # not reported


def _server_info(model: str, algorithm: str | None) -> dict:
    """What SGLang 0.5.23's /server_info holds for a server (the fields onboarding reads)."""
    return {
        "model_path": f"org/{model}",
        "served_model_name": model,
        "speculative_algorithm": algorithm,
        "speculative_num_steps": 3 if algorithm else None,
        "speculative_eagle_topk": 1 if algorithm else None,
        "speculative_num_draft_tokens": 4 if algorithm else None,
        "max_running_requests": 64,
        "tp_size": 2,
        "enable_metrics": True,
        "enable_cache_report": True,
        "version": "0.5.23",
        "internal_states": [{"effective_max_running_requests_per_dp": 64}],
    }


@contextlib.contextmanager
def sglang_like(documents: dict[str, dict], key: str | None = None, seen: list | None = None) -> Iterator[str]:
    """An HTTP server in its own thread answering /server_info, /v1/models and /v1/loads with these
    documents (path -> JSON); with `key`, only requests bearing it (else 401, as SGLang's --api-key).
    `seen` collects the Authorization header of every request."""
    port = free_port()
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    async def handle(request: web.Request) -> web.Response:
        path = request.path
        auth = request.headers.get("Authorization")
        if seen is not None:
            seen.append(auth)
        if key is not None and auth != f"Bearer {key}":
            return web.json_response({"error": "unauthorized"}, status=401)
        if path in documents:
            return web.json_response(documents[path])
        return web.json_response({"detail": "Not Found"}, status=404)

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _documents(model: str, algorithm: str | None) -> dict[str, dict]:
    return {
        "/server_info": _server_info(model, algorithm),
        "/v1/models": {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 131072}]},
        "/v1/loads": {"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0, "max_running_requests": 64}]},
    }


def test_init_from_urls_classifies_twins_and_sglang_servers(tmp_path, capsys):
    with contextlib.ExitStack() as stack:
        twins = {
            p: stack.enter_context(twin(p))
            for p in ("k26-ar", "k26-eagle3", "k26-dflash", "k26-ddtree", "k26-ngram", "qwen36-ddtree-b15")
        }
        legacy = stack.enter_context(twin("k26-dflash", "--compat", "0.5.9"))
        others = {
            algo: stack.enter_context(sglang_like(_documents("gemma-9b", algo)))
            for algo in ("EAGLE", "STANDALONE", "DSPARK", "UNO", "FROZEN_KV_MTP", "NEXTN", "MY_SPEC")
        }
        locked = stack.enter_context(sglang_like(_documents("gemma-9b", None), key="sk-other"))
        gone = f"http://127.0.0.1:{free_port()}"
        urls = [*twins.values(), legacy, *others.values(), locked, gone]
        out = tmp_path / "specroute.toml"
        code = config_main(["init", "--from-urls", ",".join(urls), "--output", str(out)])
        err = capsys.readouterr().err
    assert code == 0, err
    config = load_config(out)  # what `specroute serve` would load
    got = {b.url: (b.name, b.model, b.strategy) for b in config.backends}
    assert got[twins["k26-ar"]] == ("kimi-k2.6-ar", "kimi-k2.6", "ar")
    assert got[twins["k26-eagle3"]] == ("kimi-k2.6-eagle3", "kimi-k2.6", "eagle3")
    assert got[twins["k26-dflash"]][1:] == ("kimi-k2.6", "dflash")
    assert got[legacy][1:] == ("kimi-k2.6", "dflash")  # 0.5.9 answers /server_info the same way
    assert {got[twins["k26-dflash"]][0], got[legacy][0]} == {"kimi-k2.6-dflash", "kimi-k2.6-dflash-2"}
    assert got[twins["k26-ddtree"]] == ("kimi-k2.6-ddtree", "kimi-k2.6", "ddtree")
    assert got[twins["k26-ngram"]] == ("kimi-k2.6-ngram", "kimi-k2.6", "ngram")
    assert got[twins["qwen36-ddtree-b15"]] == ("qwen3.6-27b-ddtree", "qwen3.6-27b", "ddtree")
    for algo, strategy in (("EAGLE", "eagle3"), ("STANDALONE", "eagle3"), ("DSPARK", "dflash"), ("UNO", "eagle3")):
        assert got[others[algo]][1:] == ("gemma-9b", strategy), algo
    assert got[others["FROZEN_KV_MTP"]][2] == "eagle3" and got[others["NEXTN"]][2] == "eagle3"
    # the servers it could not configure are in the file, commented out, with the reason
    assert others["MY_SPEC"] not in got and locked not in got and gone not in got
    text = out.read_text()
    assert f"# NOT CONFIGURED: {others['MY_SPEC']}: speculative_algorithm MY_SPEC:" in text
    assert f"# NOT CONFIGURED: {locked}: /server_info answered 401: the server needs an API key" in text
    assert f"# NOT CONFIGURED: {gone}: unreachable" in text
    # grouped by model: every kimi-k2.6 backend before the first gemma one
    models = [b.model for b in config.backends]
    assert models.index("gemma-9b") > max(i for i, m in enumerate(models) if m == "kimi-k2.6")
    # what the gateway will miss is said next to the server
    assert "started without --enable-metrics" in text and "a twin: `specroute sim --profile k26-ddtree`" in text
    assert "no /v1/loads (SGLang before 0.5.23)" in text and "no per-request speculation details" in text
    assert "3 commented out" in err
    assert config_main(["check", str(out)]) == 0


def test_init_from_urls_with_nothing_to_configure_fails(tmp_path, capsys):
    gone = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "c.toml"
    assert config_main(["init", "--from-urls", gone, "--output", str(out)]) == 1
    assert "no server could be configured" in capsys.readouterr().err
    assert "# NOT CONFIGURED" in out.read_text()


def test_init_from_urls_refuses_bad_input(capsys):
    assert config_main(["init", "--from-urls", "gpu-a:30000"]) == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err
    assert config_main(["init", "--from-urls", "http://a:1", "--from-profiles", "k26-ar=http://b:1"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert config_main(["init", "--from-urls", "http://a:1", "--api-key-env", "SPECROUTE_TEST_UNSET_KEY"]) == 2
    assert "the variable is not set" in capsys.readouterr().err


def test_init_from_urls_sends_the_key(tmp_path, monkeypatch):
    seen: list[str | None] = []
    monkeypatch.setenv("SPECROUTE_TEST_KEY", "sk-test")
    with sglang_like(_documents("gemma-9b", "EAGLE3"), key="sk-test", seen=seen) as url:
        out = tmp_path / "c.toml"
        assert config_main(["init", "--from-urls", url, "--api-key-env", "SPECROUTE_TEST_KEY", "-o", str(out)]) == 0
    assert [(b.model, b.strategy) for b in load_config(out).backends] == [("gemma-9b", "eagle3")]
    assert seen and set(seen) == {"Bearer sk-test"}
    assert "sk-test" not in out.read_text()  # the key is used, never written
