"""`specroute profile`: a sweep of a live server, fitted to a twin profile that predicts it.

The servers are twins of profiles this test writes (a model of its own, `test-llm`, with
parameters no bundled profile has): the fitted profile must predict its twin at load points the
sweep never uses (C = 3, 12, 24; prompts of 4096 and 16384 tokens; T = 0.6) within 10% on mean
request tok/s and TTFT, and `specroute plan` on the fitted profiles must pick the fleet it picks
on the true ones, or one within 3% of its score. The comparison is on the virtual clock, the same
engine the twins run, so it measures the fit and nothing else. Bad input: an unreachable server,
a busy one, SGLang 0.5.9 (no per-request speculation details), a cap of 1, errors mid-sweep.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import tomllib
import urllib.request
from pathlib import Path

import msgspec
import pytest

from evaluate.plan import plan
from evaluate.traffic import load_traffic
from tests.support import TRACE_SLICE, free_port, running, specroute, wait_until
from tools.fit.measurements import load_measurements
from tools.fit.validate import points_of, predict_point
from twin.profile import load_profile, numeric_parameters

SCALE = "0.02"
# The fitted twins run slower than the others: a round's steady stretch must span a few of the
# sweep's reads of /v1/loads on a busy machine (at time scale 1, as in use, it spans hundreds).
FIT_SCALE = "0.05"

_STEP = """
[step]
t0_ms = 25.0
k_ms = 0.05
knee_tokens = 140
k_compute_ms = 0.08
prefill_ms_base = 20.0
prefill_ms_per_token = 0.08
kv_ns_per_token = 40.0
prefill_attn_ms_per_mpair = 0.9
"""
_LENGTHS = """
[reasoning]
parser = "kimi_k2"
math = 400
code = 300
chat = 150
spread = 0.5
max_tokens = 32768

[answer]
math = 250
code = 300
chat = 180
spread = 0.4
"""
TRUE_DFLASH = (
    """name = "test-dflash"
description = "the test's DFlash server"
strategy = "dflash"
served_model_name = "test-llm"
model_path = "test/test-llm"
context_length = 131072
max_running_requests = 32
max_total_num_tokens = 200000
tp_size = 4
attention_backend = "flashinfer"
"""
    + _STEP
    + """draft_ms = 2.0
draft_ms_per_seq = 0.3

[speculative]
algorithm = "DFLASH"
draft_model_path = "test/test-llm-dflash"
num_steps = 1
eagle_topk = 1
num_draft_tokens = 6
dflash_block_size = 6
draft_window_tokens = 2048
window_miss_per_doubling = 0.12

[acceptance]
math = 0.84
code = 0.78
chat = 0.72
prompt_spread = 0.12

[temperature]
math = 1.3
code = 1.2
chat = 1.1
"""
    + _LENGTHS
)
TRUE_AR = (
    """name = "test-ar"
description = "the test's autoregressive server"
strategy = "ar"
served_model_name = "test-llm"
model_path = "test/test-llm"
context_length = 131072
max_running_requests = 48
max_total_num_tokens = 210000
tp_size = 4
attention_backend = "flashinfer"
"""
    + _STEP
    + _LENGTHS
)


def _with_provenance(text: str) -> str:
    """The profile with a provenance entry per numeric parameter, as the twin requires."""
    names = numeric_parameters(tomllib.loads(text))
    return text + "\n[provenance]\n" + "".join(f'"{n}" = "design: the test\'s choice"\n' for n in names)


def _sweep(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        specroute("profile", url, "-o", str(out), "--quick", *extra), capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Twins of the two true profiles, each swept and fitted: (true dir, fitted dir, {name: url})."""
    root = tmp_path_factory.mktemp("fit")
    true, out = root / "true", root / "fitted"
    true.mkdir()
    out.mkdir()
    urls: dict[str, str] = {}
    for name, text in (("test-dflash", TRUE_DFLASH), ("test-ar", TRUE_AR)):
        path = true / f"{name}.toml"
        path.write_text(_with_provenance(text))
        load_profile(str(path))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = specroute(
            "sim",
            "--profile",
            str(path),
            "--port",
            str(port),
            "--time-scale",
            FIT_SCALE,
            "--reasoning-parser",
            "kimi_k2",
        )
        with running(cmd, ready_url=f"{url}/ready"):
            res = _sweep(url, out / f"{name}.toml")
        assert res.returncode == 0, res.stderr[-3000:]
        urls[name] = url
    return true, out, urls


@pytest.mark.parametrize("name", ["test-dflash", "test-ar"])
def test_fitted_profile_predicts_held_out_points(fitted, name):
    true, out, _ = fitted
    truth, fit = load_profile(str(true / f"{name}.toml")), load_profile(str(out / f"{name}.toml"))
    worst = 0.0
    for point in points_of([3, 12, 24], [4096, 16384], 0.6, 256, 0):
        t, p = predict_point(truth, point), predict_point(fit, point)
        for label, a, b in (("tok/s", t.request_tok_s, p.request_tok_s), ("TTFT", t.ttft_s, p.ttft_s)):
            error = b / a - 1
            worst = max(worst, abs(error))
            assert abs(error) <= 0.10, f"{name} C={point.concurrency} P={point.prompt_tokens} {label}: {error:+.1%}"
    print(f"{name}: worst held-out error {100 * worst:.1f}%")


def test_fitted_profile_says_where_each_number_comes_from(fitted):
    _, out, urls = fitted
    text = (out / "test-dflash.toml").read_text()
    profile = load_profile(str(out / "test-dflash.toml"))
    assert profile.served_model_name == "test-llm" and profile.strategy.value == "dflash"
    assert profile.max_running_requests == 32 and profile.max_total_num_tokens == 200000
    assert profile.speculative is not None and profile.speculative.dflash_block_size == 6
    for name, entry in profile.provenance.items():
        assert entry.startswith((f"measured: {urls['test-dflash']}, ", "assumption: not measured", "derived: ")), name
    assert profile.provenance["step.t0_ms"].count("decode windows") == 1
    assert "prefills alone" in profile.provenance["step.prefill_ms_per_token"]
    assert "requests at T=0" in profile.provenance["acceptance.chat"]
    # what it could not measure is named, not defaulted in silence
    assert "# Not measured" in text and "step.draft_ms" in text and "default_temperature" in text
    # the fit's own account: points and residuals next to the profile
    details = json.loads((out / "test-dflash.fit.json").read_text())
    assert details["step"]["rms"] < 0.02 and details["prefill"]["rms"] < 0.02
    assert set(details["accept"]["accept"]) == {"math", "code", "chat"}
    ar = load_profile(str(out / "test-ar.toml"))
    assert ar.speculative is None and ar.acceptance is None and ar.reasoning is not None


def _canonical(fleet: str, directory: Path) -> str:
    return fleet.replace(f"{directory}/", "").replace(".toml", "")


def test_plan_on_fitted_profiles_picks_the_fleet_of_the_true_ones(fitted, tmp_path):
    true, out, _ = fitted
    traffic_file = tmp_path / "traffic.jsonl"
    traffic_file.write_text(
        '{"settings": {"min_tokens": 128, "max_tokens": 384}}\n'
        '{"name": "busy", "hours": 8, "rate": 2.5, "mix": {"thinking": 0.5, "temperatures": [[0, 0.5], [0.6, 0.5]]}}\n'
        '{"name": "quiet", "hours": 16, "rate": 0.6}\n'
    )
    traffic = load_traffic(str(traffic_file))
    kw = {"sample_s": 30.0, "jobs": 1, "exhaustive": True}
    on_true = plan(3, traffic, types=sorted(str(p) for p in true.glob("*.toml")), **kw)
    on_fit = plan(3, traffic, types=sorted(str(p) for p in out.glob("*.toml")), **kw)
    want, got = _canonical(on_true.ranked[0].fleet, true), _canonical(on_fit.ranked[0].fleet, out)
    print(f"plan on the true profiles: {want} ({on_true.ranked[0].score:.2f}); on the fitted: {got}")
    if want != got:  # the fitted plan's pick, scored on the true profiles, within 3% of the true pick
        assert on_true.exhaustive is not None
        scores = {_canonical(k, true): v for k, v in on_true.exhaustive.scores.items()}
        assert scores[got] >= 0.97 * scores[want], (want, got, scores)


def test_sim_serves_a_fitted_profile(fitted):
    _, out, _ = fitted
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute("sim", "--profile", str(out / "test-dflash.toml"), "--port", str(port), "--time-scale", SCALE)
    with running(cmd, ready_url=f"{url}/ready"):
        with urllib.request.urlopen(f"{url}/server_info", timeout=10) as r:
            info = json.loads(r.read())
        body = json.dumps(
            {"model": "test-llm", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
        ).encode()
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
    assert (info["served_model_name"], info["speculative_algorithm"]) == ("test-llm", "DFLASH")
    assert info["speculative_dflash_block_size"] == 6 and answer["usage"]["completion_tokens"] == 8


def test_fit_again_from_the_kept_measurements(fitted, tmp_path):
    _, out, _ = fitted
    again = tmp_path / "again.toml"
    res = subprocess.run(
        specroute("profile", "fit", str(out / "test-dflash.measurements.json"), "-o", str(again)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    a, b = load_profile(str(out / "test-dflash.toml")), load_profile(str(again))
    assert msgspec.structs.replace(b, name=a.name) == a


# ------------------------------------------------------------------------------------------ bad input


def test_an_unreachable_server_is_refused(tmp_path):
    res = _sweep(f"http://127.0.0.1:{free_port()}", tmp_path / "p.toml")
    assert res.returncode == 2 and "unreachable" in res.stderr
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_a_busy_server_is_refused(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute("sim", "--profile", "k26-ar", "--port", str(port), "--time-scale", SCALE)
    with running(cmd, ready_url=f"{url}/ready"):
        body = json.dumps(
            {
                "model": "kimi-k2.6",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 100000,
                "stream": True,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        stream = urllib.request.urlopen(req, timeout=30)

        def drain() -> None:  # a client reading its stream: the request keeps running
            with contextlib.suppress(OSError, ValueError, AttributeError):  # closed under it
                while stream.read(65536):
                    pass

        threading.Thread(target=drain, daemon=True).start()

        def running_requests() -> int:
            with urllib.request.urlopen(f"{url}/v1/loads", timeout=5) as r:
                return json.loads(r.read())["loads"][0]["num_running_reqs"]

        assert wait_until(lambda: running_requests() == 1, timeout=20)
        res = _sweep(url, tmp_path / "p.toml")
        stream.close()
    assert res.returncode == 2, res.stderr
    assert "busy (1 running, 0 waiting requests, from /v1/loads)" in res.stderr
    assert not (tmp_path / "p.toml").exists()


def test_sglang_0_5_9_without_speculation_details_keeps_its_measurements(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute("sim", "--profile", "k26-dflash", "--port", str(port), "--time-scale", SCALE, "--compat", "0.5.9")
    with running(cmd, ready_url=f"{url}/ready"):
        res = _sweep(url, tmp_path / "p.toml")
    assert res.returncode == 1, res.stderr
    assert "sent no per-request speculation details" in res.stderr and "no profile written" in res.stderr
    assert not (tmp_path / "p.toml").exists()
    kept = load_measurements(tmp_path / "p.measurements.json")
    assert kept.facts.load_path == "/get_load" and kept.facts.version == "0.5.9"
    assert {lv.kind for lv in kept.levels} >= {"prefill", "step", "accept"}
    # the step and prefill times are still measured, on the client's clock
    assert "(client clock)" in res.stdout and "(TTFT)" in res.stdout


def test_a_cap_of_one_is_fitted_without_a_slope(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute(
        "sim", "--profile", "k26-eagle3", "--port", str(port), "--time-scale", SCALE, "--max-running-requests", "1"
    )
    with running(cmd, ready_url=f"{url}/ready"):
        res = _sweep(url, tmp_path / "p.toml", "--max-prompt-tokens", "8192")
    assert res.returncode == 0, res.stderr[-3000:]
    fit = load_profile(str(tmp_path / "p.toml"))
    assert fit.max_running_requests == 1
    assert fit.provenance["step.k_ms"].startswith("assumption: not measured") and "cap 1" in fit.provenance["step.k_ms"]
    truth = msgspec.structs.replace(load_profile("k26-eagle3"), max_running_requests=1)
    for point in points_of([1], [4096], 0.6, 256, 12):
        t, p = predict_point(truth, point), predict_point(fit, point)
        assert abs(p.request_tok_s / t.request_tok_s - 1) <= 0.10 and abs(p.ttft_s / t.ttft_s - 1) <= 0.10


def test_errors_mid_sweep_stop_it_and_keep_the_measurements(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specroute(
        "sim", "--profile", "k26-ar", "--port", str(port), "--time-scale", SCALE, "--fault-error-rate", "0.05"
    )
    with running(cmd, ready_url=f"{url}/ready"):
        res = _sweep(url, tmp_path / "p.toml")
    assert res.returncode == 1, res.stderr
    assert "the sweep stopped" in res.stderr and "kept in" in res.stderr
    kept = load_measurements(tmp_path / "p.measurements.json")
    assert kept.stopped is not None and "HTTP 500" in kept.stopped
    assert not (tmp_path / "p.toml").exists()


def test_plan_and_eval_take_the_fitted_profiles_on_a_trace_and_a_file(fitted, tmp_path):
    _, out, _ = fitted
    trace = TRACE_SLICE
    types = sorted(str(p) for p in out.glob("*.toml"))
    res = plan(2, load_traffic(f"trace:{trace}"), types=types, seeds=1, jobs=1)
    assert res.ranked and all(str(out) in f.fleet for f in res.ranked)
    traffic_file = tmp_path / "short.jsonl"
    traffic_file.write_text('{"name": "steady", "minutes": 30, "rate": 1.5, "sample_s": 20}\n')
    run = subprocess.run(
        specroute(
            "eval", "--traffic", str(traffic_file), "--profiles", str(out), "--servers", "2", "--output", str(tmp_path)
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    fleets = {r["fleet"] for r in json.loads((tmp_path / "eval.json").read_text())["scenarios"].values()}
    assert fleets == {f"2x{out / 'test-ar.toml'}", f"2x{out / 'test-dflash.toml'}"}
