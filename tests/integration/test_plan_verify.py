"""`specroute plan --verify`: the plan's winner and best homogeneous fleet run over real HTTP (one
twin process per server, a gateway, loadgen) beside the virtual clock. One reduced run end to end,
twins at 10x. The 15% agreement is the command's verdict (exit status 1 when it disagrees), not
asserted here: a busy 2-core machine starves processes at 10x."""

from __future__ import annotations

import json
import math

from evaluate.cli_plan import main

TYPES = ("k26-eagle3", "k26-dflash")
TRAFFIC = [
    {"settings": {"min_tokens": 48, "max_tokens": 96}},
    {"name": "quiet", "hours": 6, "rate": 0.5, "domains": {"math": 1}},
    # bursty: loadgen's arrivals are Poisson, so the virtual side of the check must be too
    {"name": "busy", "hours": 2, "rate": 2.0, "arrival": "bursty", "domains": {"chat": 1, "code": 1}},
]


def test_verify_runs_both_fleets_over_http_and_reports_the_ratio(tmp_path, capsys):
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRAFFIC))
    out = tmp_path / "out"
    args = ["--servers", "2", "--traffic", str(path), "--types", ",".join(TYPES), "--sample-s", "30"]
    args += ["--jobs", "1", "--seeds", "1", "--verify", "--verify-time-scale", "0.1", "--output", str(out)]
    code = main(args)
    printed = capsys.readouterr().out
    assert code in (0, 1), printed  # 1: the ratios disagree (reported, not this test's verdict)
    assert "== verify over HTTP: phase busy as single requests, Poisson at 2.00 req/s" in printed
    plan = json.loads((out / "plan.json").read_text())
    check = json.loads((out / "verify.json").read_text())
    assert check["phase"] == "busy" and check["rate_rps"] == 2.0 and check["agrees"] == (code == 0)
    winner, rival = check["runs"]
    assert winner["fleet"] == plan["ranked"][0]["fleet"]
    # against the best homogeneous fleet, or the runner-up when that is the winner: never itself
    if plan["best_homogeneous"]["fleet"] != winner["fleet"]:
        assert check["versus"] == "homogeneous" and rival["fleet"] == plan["best_homogeneous"]["fleet"]
    else:
        assert check["versus"] == "runner-up" and rival["fleet"] == plan["ranked"][1]["fleet"]
    for label, run in (("winner", winner), (check["versus"], rival)):
        lines = (out / label / "loadgen" / "requests.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert len(records) == run["http_requests"] >= 60  # ~180 arrivals in 90 simulated s
        assert run["http_errors"] == 0 and all(r["ok"] for r in records)
        assert all(r["backend"].startswith(TYPES) for r in records)  # the fleet's twins, through the gateway
        assert run["http_tok_s"] > 0 and run["virtual_tok_s"] > 0
    ratio = winner["http_tok_s"] / rival["http_tok_s"]
    assert math.isclose(check["http_ratio"], ratio, rel_tol=1e-9)
    assert (
        f"winner / {check['versus']}: virtual {check['virtual_ratio']:.3f}, http {check['http_ratio']:.3f}" in printed
    )
