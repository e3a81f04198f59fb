"""A recipe's explained launch script, run: it runs the same command `specroute backends launch`
prints (the recipes themselves: tests/unit/test_launch_recipes.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tools.launch import LaunchOptions, command, explained, load_recipe


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_explained_script_runs_the_same_command(tmp_path):
    """`show --explain` is a real bash script: run with `echo` as the interpreter it prints the same argv."""
    prof = load_recipe("qwen36-ddtree-b15")
    opts = LaunchOptions(python="echo", gpus=(2,))
    script = tmp_path / "launch.sh"
    script.write_text(explained(prof, opts))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == command(prof, opts)[1:]
    assert "# study: budget 15 is best on Qwen3.6" in script.read_text()
