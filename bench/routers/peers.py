"""The peers: SGLang's router (`sglang-router`) and the LiteLLM proxy, each in a virtualenv of its own.

They are not dependencies of specroute: `ensure_venvs()` creates `.venv-bench/sglang-router` and
`.venv-bench/litellm` with the ordinary `python -m venv` and `pip install` from the package index
the machine is configured with, once; later runs reuse them. Versions are pinned below with a floor
so that a re-run measures the same programs.

Configuration, as an operator would write it:
- SGLang router (`python -m sglang_router.launch_router`): `--worker-urls` and `--policy`, nothing
  else. Its HTTP mode routes on the request text (cache_aware keeps a character radix tree per
  worker) and needs no tokenizer; `HF_HUB_OFFLINE=1` makes sure nothing is looked up on a hub.
- LiteLLM proxy: one `model_name` with a deployment per backend (`openai/<model>` at the twin's
  `/v1`), `router_settings.routing_strategy`, one uvicorn worker (its default), a local master key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["LITELLM_STRATEGIES", "SGLANG_POLICIES", "ensure_venvs", "litellm_cmd", "litellm_config", "sglang_cmd"]

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venv-bench"
PACKAGES = {"sglang-router": "sglang-router>=0.3.2", "litellm": "litellm[proxy]>=1.108"}
SGLANG_POLICIES = ("round_robin", "power_of_two", "cache_aware")
LITELLM_STRATEGIES = ("simple-shuffle", "least-busy")
MASTER_KEY = "sk-specroute-bench-local"  # loopback only, a throwaway process


def _python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_venvs() -> None:
    """Create the peers' virtualenvs when missing (takes a few minutes the first time)."""
    for name, requirement in PACKAGES.items():
        if _python(name).exists():
            continue
        print(f"creating {VENVS / name} with {requirement} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENVS / name)], check=True)
        subprocess.run([str(_python(name)), "-m", "pip", "install", "-q", requirement], check=True)


def offline_env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "NO_DOCS": "True",
    }


def sglang_cmd(port: int, workers: list[str], policy: str, python: str | None = None) -> list[str]:
    """SGLang's router on 127.0.0.1:`port` over `workers`; `python` is the venv's interpreter that
    has `sglang-router` (default: this bench's own venv of it)."""
    return [
        python or str(_python("sglang-router")),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        policy,
        "--log-level",
        "warn",
    ]


def litellm_config(model: str, workers: list[str], strategy: str) -> str:
    lines = ["model_list:"]
    for url in workers:
        lines += [
            f"  - model_name: {model}",
            "    litellm_params:",
            f"      model: openai/{model}",
            f"      api_base: {url}/v1",
            "      api_key: none",
        ]
    lines += ["router_settings:", f"  routing_strategy: {strategy}", "litellm_settings:", "  telemetry: false"]
    return "\n".join(lines) + "\n"


def litellm_cmd(port: int, config: Path) -> list[str]:
    return [
        str(VENVS / "litellm" / "bin" / "litellm"),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
