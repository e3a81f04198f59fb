"""Kubernetes manifests of the gateway (deploy/k8s), validated without a cluster.

Schema validation uses `kubernetes-validate` (PyPI; it ships the Kubernetes OpenAPI-derived JSON schemas
per release) in strict mode, against the oldest and the newest release it knows. The rest are the
project's own rules: probes on /ready and /health, non-root, resources, HPA on CPU, PDB, and the
ConfigMap's config loading with gateway.config. A last test runs the gateway with that config to
show the probes mean what the Deployment expects.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway.config import load_config
from tests.support import BIN, REPO, free_port, running, specroute, wait_until

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the manifests")

K8S = REPO / "deploy" / "k8s"


def _docs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _kind(kind: str) -> dict:
    (doc,) = [d for _, d in _docs() if d["kind"] == kind]
    return doc


@pytest.fixture(scope="module")
def kv():
    return pytest.importorskip("kubernetes_validate", reason="dev extra kubernetes-validate validates manifests")


def _versions(kv) -> list[str]:
    from kubernetes_validate.utils import all_versions

    known = sorted(set(all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
    return [known[0], known[-1]]


def test_manifests_are_valid_kubernetes(kv):
    docs = _docs()
    assert {d["kind"] for _, d in docs} >= {
        "Deployment",
        "Service",
        "ConfigMap",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }
    for version in _versions(kv):
        for _, doc in docs:
            kv.validate(doc, version, strict=True)  # raises with the path of the first error


def test_validator_refuses_broken_manifests(kv):
    version = _versions(kv)[-1]
    deployment = _kind("Deployment")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, version, strict=True)
    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["replicas"] = "three"
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong_type, version, strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    namespaces = {d["metadata"].get("namespace") for _, d in _docs() if d["kind"] != "Namespace"}
    assert namespaces == {kustomization["namespace"]}


def test_deployment_rules():
    dep = _kind("Deployment")
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    assert spec["replicas"] >= 2
    assert spec["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    # The uid the pod runs as is the image's USER.
    user = re.findall(r"^USER\s+(\d+)", (REPO / "Dockerfile").read_text(), re.M)[-1]
    assert str(pod["securityContext"]["runAsUser"]) == user
    # The config path in the args lies in the ConfigMap's mount, mounted as a directory (updates propagate).
    assert container["command"] == ["specroute-gateway"]  # the product's own command, the image's entrypoint
    args = container["args"]
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == config_path.parent)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "subPath" not in mount
    assert volume["configMap"]["name"] == _kind("ConfigMap")["metadata"]["name"]
    assert config_path.name in _kind("ConfigMap")["data"]
    port = container["ports"][0]["containerPort"]
    assert args[args.index("--listen") + 1] == f"0.0.0.0:{port}"


def test_service_hpa_pdb_target_the_deployment():
    dep = _kind("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = _kind("Service")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    hpa = _kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": dep["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    pdb = _kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a node drain can always proceed


def _configmap_config(tmp_path: Path) -> Path:
    path = tmp_path / "specroute.toml"
    path.write_text(_kind("ConfigMap")["data"]["specroute.toml"])
    return path


def test_configmap_config_loads(tmp_path):
    config = load_config(_configmap_config(tmp_path))
    assert config.gateway.listen == "0.0.0.0:8000"
    # The drain fits the pod's grace: the preStop sleep, then shutdown_grace_s, then the server's
    # one-second backstop (gateway/serve.py), all before the kubelet's SIGKILL.
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pre_stop + math.ceil(config.gateway.shutdown_grace_s) + 1 < pod["terminationGracePeriodSeconds"]
    assert config.gateway.shutdown_grace_s > 60  # and uses most of it: thinking streams last minutes
    assert {b.model for b in config.backends} == {"kimi-k2.6", "qwen3.6-27b"}
    assert {b.strategy for b in config.backends} == {"ar", "eagle3", "dflash", "ddtree"}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def test_probes_mean_what_the_deployment_expects(tmp_path):
    """With the ConfigMap's config: /health (liveness) stays 200 while no backend is reachable and /ready
    (readiness) turns 503; once a backend per served model is up, /ready turns 200 again."""
    text = _kind("ConfigMap")["data"]["specroute.toml"]
    ports = {name: free_port() for name in re.findall(r'name = "([^"]+)"', text)}
    for name, port in ports.items():
        # each headless Service's name standing for one address: its twin's (an IP resolves to itself)
        text = re.sub(
            rf'url = "http://sglang-{re.escape(name)}-headless:30000"', f'url = "http://127.0.0.1:{port}"', text
        )
    gw = free_port()
    text = text.replace('listen = "0.0.0.0:8000"', f'listen = "127.0.0.1:{gw}"')
    path = tmp_path / "specroute.toml"
    path.write_text(text)
    load_config(path)
    base = f"http://127.0.0.1:{gw}"
    with running(
        [str(BIN / "specroute-gateway"), "serve", "--config", str(path)], ready_url=f"{base}/health", timeout=60
    ):
        # Backends start optimistic; `health.unhealthy_after` failed checks take them out of the pool.
        assert wait_until(lambda: _status(f"{base}/ready") == 503, timeout=15)
        assert _status(f"{base}/health") == 200
        twins = [
            specroute("sim", "--profile", name, "--port", str(ports[name]), "--time-scale", "0.02")
            for name in ("k26-ar", "qwen36-ddtree-b15")
        ]
        with (
            running(twins[0], ready_url=f"http://127.0.0.1:{ports['k26-ar']}/ready"),
            running(twins[1], ready_url=f"http://127.0.0.1:{ports['qwen36-ddtree-b15']}/ready"),
        ):
            assert wait_until(lambda: _status(f"{base}/ready") == 200, timeout=15)


def test_kustomize_output_is_valid_kubernetes(kv):
    """What `kubectl apply -k deploy/k8s` would send: kustomize's rendering (namespace and labels applied),
    each object validated strictly."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with kustomize built in) is not installed")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert len(docs) == len(_docs())
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute" for d in docs)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"specroute"}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "specroute:0.1.0"
    for version in _versions(kv):
        for doc in docs:
            kv.validate(doc, version, strict=True)
