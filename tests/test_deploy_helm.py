"""The Helm chart (deploy/helm/specroute), rendered offline and validated, and held equal to deploy/k8s.

The renderer is Helm itself: `helm-python-sdk` (PyPI) binds Helm 4's Go SDK through a C library in its
wheel, so `Chart.render` is `helm template` without a helm binary or a cluster. The rendered objects are
validated with kubernetes-validate (strict, oldest and newest Kubernetes release it knows), and with the
default values they must be the objects `kubectl kustomize deploy/k8s` renders, apart from Helm's own
labels and the Namespace (`helm install --create-namespace` makes it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.config import load_config
from tests.support import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the manifests")
helm = pytest.importorskip("helm_python", reason="dev extra helm-python-sdk renders the chart (Helm's Go SDK)")

CHART = REPO / "deploy" / "helm" / "specroute"
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}


def render(values: dict[str, Any] | None = None, name: str = "specroute", namespace: str = "specroute") -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=name, namespace=namespace)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for d in docs:
        assert d["kind"] not in out, f"two {d['kind']} objects"
        out[d["kind"]] = d
    return out


@pytest.fixture(scope="module")
def kv():
    return pytest.importorskip("kubernetes_validate", reason="dev extra kubernetes-validate validates manifests")


def _versions(kv) -> list[str]:
    from kubernetes_validate.utils import all_versions

    known = sorted(set(all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
    return [known[0], known[-1]]


def _validate(kv, docs: list[dict]) -> None:
    for version in _versions(kv):
        for doc in docs:
            kv.validate(doc, version, strict=True)  # raises with the path of the first error


def test_chart_lints_and_renders_valid_kubernetes(kv):
    report = helm.lint(CHART, strict=True)
    assert report["errors"] == [] and all(m["severity"] <= 1 for m in report["messages"]), report  # 1 = INFO
    docs = render()
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Secret",
        "NetworkPolicy",
    }
    _validate(kv, docs)


def test_values_schema_refuses_bad_values():
    for bad in (
        {"replicaCount": "three"},
        {"image": {"repository": "x", "tga": "1"}},
        {"auth": {"apiKeys": ["a,b"]}},
        {"service": {"port": 0}},
        {"replicas": 3},
    ):
        with pytest.raises(helm.HelmError):
            render(bad)


def _kustomize() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with kustomize built in) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(REPO / "deploy" / "k8s")], capture_output=True, text=True, timeout=60, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _without_helm_labels(doc: dict) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(doc))
    labels = doc["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    return doc


def test_default_values_render_what_kustomize_renders():
    # the Secret of keys: the chart makes one (generated keys); with kustomize the operator does
    helm_docs = {(d["kind"], d["metadata"]["name"]): _without_helm_labels(d) for d in render() if d["kind"] != "Secret"}
    kustomized = {(d["kind"], d["metadata"]["name"]): d for d in _kustomize() if d["kind"] != "Namespace"}
    assert set(helm_docs) == set(kustomized)
    for key, expected in kustomized.items():
        assert helm_docs[key] == expected, key


def test_replicas_autoscaling_and_pdb_follow_the_values(kv):
    docs = by_kind(
        render(
            {
                "replicaCount": 5,
                "autoscaling": {"enabled": False},
                "podDisruptionBudget": {"enabled": True, "minAvailable": 4},
            }
        )
    )
    assert docs["Deployment"]["spec"]["replicas"] == 5
    assert "HorizontalPodAutoscaler" not in docs
    assert docs["PodDisruptionBudget"]["spec"]["minAvailable"] == 4
    docs = by_kind(
        render(
            {
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 4,
                    "maxReplicas": 20,
                    "targetCPUUtilizationPercentage": 60,
                },
                "podDisruptionBudget": {"enabled": False},
            }
        )
    )
    hpa = docs["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (4, 20)
    assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    assert "PodDisruptionBudget" not in docs
    _validate(kv, list(docs.values()))


def test_api_keys_become_a_secret_the_deployment_reads(kv):
    docs = by_kind(render({"auth": {"apiKeys": ["key-a", "key-b"], "adminKey": "adm"}}, name="edge", namespace="llm"))
    secret = docs["Secret"]
    assert secret["metadata"] == {**secret["metadata"], "name": "edge-keys", "namespace": "llm"}
    assert secret["stringData"] == {"api-keys": "key-a,key-b", "admin-key": "adm"}
    env = {e["name"]: e for e in docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SPECROUTE_API_KEYS"]["valueFrom"]["secretKeyRef"] == {"name": "edge-keys", "key": "api-keys"}
    assert env["SPECROUTE_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "edge-keys"
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"] == "k8s.namespace.name=llm,k8s.deployment.name=edge-gateway"
    _validate(kv, list(docs.values()))
    # An existing Secret: referenced, not made.
    docs = by_kind(render({"auth": {"existingSecret": "vault-keys", "apiKeys": ["ignored"]}}))
    assert "Secret" not in docs
    env = {e["name"]: e for e in docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SPECROUTE_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "vault-keys"


def test_keys_not_given_are_generated_and_only_clients_reach_the_port(kv):
    """Secure by default: with no keys in the values the chart generates both (a gateway on a pod
    address refuses to start without an API key), and a NetworkPolicy admits only client namespaces."""
    one, two = by_kind(render()), by_kind(render())
    keys = one["Secret"]["stringData"]
    assert len(keys["api-keys"]) >= 32 and len(keys["admin-key"]) >= 32 and keys["api-keys"] != keys["admin-key"]
    assert keys != two["Secret"]["stringData"]  # random per install (an upgrade reads them back from the cluster)
    policy = one["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == one["Deployment"]["spec"]["selector"]["matchLabels"]
    (rule,) = policy["ingress"]
    assert {"namespaceSelector": {"matchLabels": {"specroute.io/client": "true"}}} in rule["from"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    _validate(kv, [one["Secret"], one["NetworkPolicy"]])
    assert "NetworkPolicy" not in by_kind(render({"networkPolicy": {"enabled": False}}))


def test_configmap_holds_a_config_the_gateway_loads(tmp_path: Path):
    custom = (
        '[gateway]\nlisten = "0.0.0.0:8000"\n\n[[backends]]\nname = "a"\nurl = "http://sglang-a:30000"\n'
        'model = "m"\nstrategy = "dflash"\n'
    )
    for values, backends in ((None, 4), ({"config": custom}, 1)):
        cm = by_kind(render(values))["ConfigMap"]
        path = tmp_path / "specroute.toml"
        path.write_text(cm["data"]["specroute.toml"])
        config = load_config(path)
        assert config.gateway.listen == "0.0.0.0:8000" and len(config.backends) == backends
    deployment = by_kind(render())["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["specroute-gateway"]
    args = container["args"]
    assert Path(args[args.index("--config") + 1]).parent == Path(container["volumeMounts"][0]["mountPath"])
