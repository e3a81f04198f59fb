"""`specroute backends check URL` against the twin (0.5.23 and `--compat 0.5.9`) and an old-server stub."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.cli_backends import main as backends_main
from tools.launch.probe import probe, render


@pytest.fixture(scope="module")
def dflash_url(twin_factory):
    return twin_factory("k26-dflash", "--lora-paths", "sql=/adapters/sql")


def _check_json(capsys, *argv: str) -> tuple[int, dict]:
    code = backends_main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_check_current_server(dflash_url, capsys):
    code, report = _check_json(capsys, dflash_url, "--recipe", "k26-dflash")
    assert code == 0, report["problems"]
    assert report["version"] == "0.5.23" and report["server_info_path"] == "/server_info"
    assert (report["algorithm"], report["strategy"]) == ("DFLASH", "dflash")
    assert report["served_model_name"] == "kimi-k2.6"
    assert report["max_running_requests"] == 48 and report["verify_width"] == 8
    assert report["load_path"] == "/v1/loads" and report["load"]["max_running"] == 48
    gen = report["generation"]
    assert gen["route"] == "/v1/chat/completions" and gen["source"] == "sglext.spec_tokens_details"
    assert gen["completion_tokens"] == 32 and gen["spec_verify_ct"] >= 1
    assert gen["accept_length"] == pytest.approx(gen["completion_tokens"] / gen["spec_verify_ct"], abs=1e-3)
    assert 1.0 <= gen["accept_length"] <= 8.0  # at most the block size
    assert report["gateway_per_request_accept"] is True and report["fallbacks"] == []
    assert report["engine_check"] == 200 and report["problems"] == []
    assert report["adapters"] == ["sql"]  # its LoRA adapters, from the /v1/models cards
    # the gateway's start-up measurement (backends.measure), taken by the gateway's own code
    startup = report["startup"]
    assert startup["step_s"] > 0 and startup["prefill_per_token_s"] is not None and report["startup_error"] is None
    assert set(startup["accept_length"]) == {"math", "code", "chat"}
    assert all(1.0 <= a <= 8.0 for a in startup["accept_length"].values())
    with urllib.request.urlopen(f"{dflash_url}/v1/models", timeout=10) as r:
        assert report["max_model_len"] == json.loads(r.read())["data"][0]["max_model_len"]

    assert backends_main(["check", dflash_url]) == 0
    text = capsys.readouterr().out
    assert "DFLASH   -> strategy dflash" in text and "max_running_requests 48" in text
    assert "completion_tokens / spec_verify_ct" in text and "fallbacks           none" in text
    assert "/health_generate 200 in" in text and f"{report['max_model_len']} tokens" in text
    assert any(line.startswith("lora adapters") and line.endswith(" sql") for line in text.splitlines())
    assert any(line.startswith("start-up measure") and "accept math" in line for line in text.splitlines())


def test_check_against_the_wrong_recipe_fails(dflash_url, capsys):
    code, report = _check_json(capsys, dflash_url, "--recipe", "k26-eagle3")
    assert code == 1
    assert any("algorithm" in p and "EAGLE3" in p for p in report["problems"])
    assert any("draft_model_path" in p for p in report["problems"])


def test_check_old_server_uses_fallbacks(twin_factory, capsys):
    url = twin_factory("k26-dflash", "--compat", "0.5.9")
    code, report = _check_json(capsys, url)
    assert code == 0, report["problems"]
    assert report["version"] == "0.5.9"
    assert report["load_path"] == "/get_load" and report["load"]["source"] == "get_load"
    gen = report["generation"]
    assert gen["route"] == "/generate" and gen["source"] == "meta_info"
    assert gen["accept_length"] == pytest.approx(gen["completion_tokens"] / gen["spec_verify_ct"], abs=1e-3)
    assert report["gateway_per_request_accept"] is False
    assert any("/get_load" in f for f in report["fallbacks"])
    assert any("/generate" in f for f in report["fallbacks"])


def test_check_autoregressive_server(twin_factory):
    report = probe(twin_factory("qwen36-ar"))
    assert report.ok and report.problems == []
    assert report.algorithm is None and report.strategy == "ar" and report.verify_width == 1
    assert report.generation is not None and report.generation.spec_verify_ct is None
    assert report.startup is not None and report.startup.step_s is not None and report.startup.accept_length == {}
    assert "none (autoregressive)" in render(report)


class _OldServer(BaseHTTPRequestHandler):
    """An SGLang 0.5.2-like server: /get_server_info, no /ready, /metrics only, no spec details on OpenAI routes."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/get_server_info":
            self._send(
                200,
                json.dumps(
                    {
                        "speculative_algorithm": "EAGLE",
                        "max_running_requests": 32,
                        "served_model_name": "old",
                        "version": "0.5.2",
                        "speculative_num_draft_tokens": 4,
                    }
                ).encode(),
            )
        elif self.path == "/health":
            self._send(200)
        elif self.path == "/metrics":
            self._send(
                200,
                b'sglang_num_running_reqs{tp="0"} 3\nsglang_num_queue_reqs 1\nsglang_spec_accept_length 2.5\n',
                "text/plain",
            )
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/chat/completions":
            self._send(
                200,
                json.dumps(
                    {
                        "choices": [{"message": {"content": "1, 2"}}],
                        "usage": {"prompt_tokens": 9, "completion_tokens": 20},
                    }
                ).encode(),
            )
        elif self.path == "/generate":
            self._send(
                200, json.dumps({"text": "1, 2", "meta_info": {"completion_tokens": 20, "spec_verify_ct": 8}}).encode()
            )
        else:
            self._send(404)


@contextlib.contextmanager
def _old_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OldServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_check_very_old_server_every_fallback():
    with _old_server() as url:
        report = probe(url)
    assert report.ok and report.problems == []
    assert report.server_info_path == "/get_server_info" and report.ready_path == "/health"
    assert (report.algorithm, report.strategy, report.max_running_requests) == ("EAGLE", "eagle3", 32)
    assert report.load_path == "/metrics" and report.load is not None
    assert (report.load.running, report.load.waiting, report.load.accept_length) == (3, 1, 2.5)
    assert report.generation is not None and report.generation.accept_length == 2.5
    assert len(report.fallbacks) == 5 and report.engine_check == 404 and report.max_model_len is None
    assert any("no engine check" in f for f in report.fallbacks)
    assert "uses the accept length /metrics reports" in render(report)
    # it streams no tokens, so the start-up measurement cannot be taken: the gateway keeps its prior
    assert report.startup is None and report.startup_error == "no request produced a token"
    assert "start-up measure    not taken (no request produced a token)" in render(report)


def test_check_unreachable_exits_1(capsys):
    with _old_server() as url:
        pass  # closed: nothing listens there any more
    assert backends_main(["check", url, "--timeout", "2"]) == 1
    assert "unreachable" in capsys.readouterr().out


@pytest.mark.parametrize("url", ["notaurl", "http://host:bad", "http://host:70000", "http://"])
def test_check_refuses_a_url_that_is_not_a_server_s_base_url(url, capsys):
    try:
        code = backends_main(["check", url])
    except SystemExit as ex:
        code = ex.code
    assert code == 2 and "argument url: expected" in capsys.readouterr().err
