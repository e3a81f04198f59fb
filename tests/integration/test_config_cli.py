"""The config's errors as `specroute serve` prints them: one line, the exit code, no traceback
(the checks themselves: tests/unit/test_config.py)."""

from __future__ import annotations

import subprocess

from tests.support import specroute
from tests.unit.test_config import ONE_BACKEND


def test_cli_bad_config_exits_nonzero_with_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[gateway]\npolicy = "fastest"\n')
    proc = subprocess.run(specroute("serve", "--config", str(path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "gateway.policy" in lines[0] and "fastest" in lines[0]


def test_cli_missing_config_file(tmp_path):
    proc = subprocess.run(
        specroute("serve", "--config", str(tmp_path / "nope.toml")), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "cannot read config file" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_listen_errors_name_the_file_or_the_flag(tmp_path):
    """From a file: `specroute: config error: <file>: gateway.listen: ...`; from --listen: the flag."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[gateway]\nlisten = "127.0.0.1:99999"\n')
    good = tmp_path / "good.toml"
    good.write_text(ONE_BACKEND)
    for argv, start in [
        (["--config", str(bad)], f"specroute: config error: {bad}: gateway.listen: "),
        (["--config", str(good), "--listen", "127.0.0.1:99999"], "specroute: config error: --listen: "),
    ]:
        proc = subprocess.run(specroute("serve", *argv), capture_output=True, text=True, timeout=60)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), proc.stderr
        assert "1..65535" in lines[0]
