"""The Helm chart (deploy/helm/specroute), rendered offline and validated, and held equal to deploy/k8s.

The renderer is Helm itself: `helm-python-sdk` (PyPI) binds Helm 4's Go SDK through a C library in its
wheel, so `Chart.render` is `helm template` without a helm binary or a cluster. The rendered objects are
validated with kubernetes-validate (strict, oldest and newest Kubernetes release it knows), and with the
default values they must be the objects `kubectl kustomize deploy/k8s` renders, apart from Helm's own
labels, the config's checksum annotation and the Namespace (`helm install --create-namespace` makes it).

No image is published, so the chart has no default repository: `render` sets deploy/k8s's
(`specroute`) unless a test gives its own, and one test shows an install without it stopped by name.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, load_config
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


# deploy/k8s's image (its kustomization sets the tag); the chart makes the operator name one.
IMAGE = {"repository": "specroute"}
# Annotations of Helm's own: the config's checksum rolls the pods on `helm upgrade`; with kustomize
# a changed ConfigMap reaches the running pods instead.
HELM_ANNOTATIONS = {"checksum/config"}


def render(
    values: dict[str, Any] | None = None, name: str = "specroute", namespace: str = "specroute", *, image: bool = True
) -> list[dict]:
    values = dict(values or {})
    if image:
        values["image"] = {**IMAGE, **values.get("image", {})}
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values or None, name=name, namespace=namespace)
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
        {"imagePullSecrets": ["regcred"]},
        {"serviceAccount": {"create": "yes"}},
        {"serviceAccount": {"role": "x"}},
        {"serviceMonitor": {"enable": True}},
        {"serviceMonitor": {"interval": "often"}},
        {"extraVolumeMounts": [{"name": "ca"}]},
        {"extraEnv": [{"value": "no name"}]},
        {"podLabels": {"team": 7}},
        {"backendKeys": {"secret": "sglang-keys"}},
        {"fullnameOverride": "Not_A_Name"},
        {"rollOnConfigChange": "yes"},
    ):
        with pytest.raises(helm.HelmError, match="specifications of the schema"):
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
    pod = doc.get("spec", {}).get("template", {}).get("metadata", {})
    for key in HELM_ANNOTATIONS:
        pod.get("annotations", {}).pop(key, None)
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


def test_without_an_image_the_install_stops_and_says_how_to_make_one():
    """No image is published: the default values name none, and rendering says what to do instead of
    leaving a pod in ImagePullBackOff."""
    with pytest.raises(helm.HelmError) as info:
        render(image=False)
    message = str(info.value)
    assert "image.repository" in message and "docker build --target gateway" in message
    (container,) = by_kind(render({"image": {"repository": "registry.example/ml/specroute", "tag": "1.2"}}))[
        "Deployment"
    ]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/ml/specroute:1.2"


# What the chart's ServiceMonitor may hold: the monitoring.coreos.com/v1 fields it renders, typed as the
# Prometheus Operator's API reference gives them, and nothing else (no CRD schema ships in a package
# the tests have, so kubernetes-validate cannot check this kind).
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "namespace": {"type": "string"},
                "labels": STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": STRING_MAP},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                        },
                    },
                },
            },
        },
    },
}

EVERY_NEW_VALUE: dict[str, Any] = {
    "image": {"repository": "registry.example/ml/specroute", "tag": "0.1.0"},
    "imagePullSecrets": [{"name": "regcred"}],
    "fullnameOverride": "llm-edge",
    "serviceAccount": {"create": True, "name": "llm-edge-sa", "annotations": {"iam.example/role": "specroute"}},
    "podLabels": {"team": "inference", "app.kubernetes.io/name": "not-the-selector"},
    "podAnnotations": {"example.com/owner": "ml-platform"},
    "backendKeys": {"existingSecret": "sglang-keys"},
    "extraEnv": [
        {"name": "SSL_CERT_FILE", "value": "/etc/specroute-ca/ca.crt"},
        {"name": "SGLANG_EXTRA_KEY", "valueFrom": {"secretKeyRef": {"name": "other-keys", "key": "extra"}}},
    ],
    "extraVolumes": [{"name": "ca", "configMap": {"name": "internal-ca"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/specroute-ca", "readOnly": True}],
    "serviceMonitor": {
        "enabled": True,
        "interval": "30s",
        "scrapeTimeout": "10s",
        "labels": {"release": "kube-prometheus-stack"},
    },
}


def test_every_new_value_renders_valid_objects(kv):
    jsonschema = pytest.importorskip("jsonschema")
    docs = by_kind(render(EVERY_NEW_VALUE, name="edge", namespace="llm"))
    assert set(docs) >= {"Deployment", "Service", "ConfigMap", "Secret", "ServiceAccount", "ServiceMonitor"}
    monitor = docs.pop("ServiceMonitor")
    jsonschema.Draft7Validator(SERVICE_MONITOR_SCHEMA).validate(monitor)
    _validate(kv, list(docs.values()))

    names = {kind: d["metadata"]["name"] for kind, d in docs.items()}
    assert names["Deployment"] == names["Service"] == "llm-edge" and monitor["metadata"]["name"] == "llm-edge"
    assert (names["ConfigMap"], names["Secret"], names["ServiceAccount"]) == (
        "llm-edge-config",
        "llm-edge-keys",
        "llm-edge-sa",
    )
    assert docs["ServiceAccount"]["metadata"]["annotations"] == {"iam.example/role": "specroute"}
    pod = docs["Deployment"]["spec"]["template"]
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "llm-edge-sa" and spec["imagePullSecrets"] == [{"name": "regcred"}]
    selector = docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert pod["metadata"]["labels"] == {**selector, "team": "inference"}  # the selector's label stays
    assert selector == {"app.kubernetes.io/name": "llm-edge"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["example.com/owner"] == "ml-platform" and len(annotations["checksum/config"]) == 64
    (container,) = spec["containers"]
    assert container["image"] == "registry.example/ml/specroute:0.1.0"
    env = [e["name"] for e in container["env"]]
    assert env[-2:] == ["SSL_CERT_FILE", "SGLANG_EXTRA_KEY"] and "SPECROUTE_API_KEYS" in env
    assert container["envFrom"] == [{"secretRef": {"name": "sglang-keys"}}]
    assert container["volumeMounts"][-1] == {"name": "ca", "mountPath": "/etc/specroute-ca", "readOnly": True}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["ca"] == {"name": "ca", "configMap": {"name": "internal-ca"}}
    assert volumes["config"]["configMap"]["name"] == "llm-edge-config"
    env_from_secret = {e["name"]: e for e in container["env"]}["SPECROUTE_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert env_from_secret["name"] == "llm-edge-keys"
    # the ServiceMonitor finds the Service, by its labels and its port's name, in its namespace
    service = docs["Service"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (monitor["spec"]["endpoints"][0]["interval"], monitor["spec"]["endpoints"][0]["scrapeTimeout"]) == (
        "30s",
        "10s",
    )
    assert by_kind(render(EVERY_NEW_VALUE, name="edge", namespace="llm"))["NetworkPolicy"]["spec"]["podSelector"] == {
        "matchLabels": selector
    }


def test_name_override_and_a_service_account_made_elsewhere(kv):
    docs = by_kind(render({"nameOverride": "router", "serviceAccount": {"create": False, "name": "shared"}}, name="r1"))
    assert docs["Deployment"]["metadata"]["name"] == "r1-router"
    assert docs["ConfigMap"]["metadata"]["name"] == "r1-config"  # named after the release, as before
    assert "ServiceAccount" not in docs
    assert docs["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == "shared"
    default_sa = by_kind(render({"serviceAccount": {"create": False}}))["Deployment"]["spec"]["template"]["spec"]
    assert default_sa["serviceAccountName"] == "default"
    assert "ServiceMonitor" not in docs  # off by default
    _validate(kv, list(docs.values()))


def test_a_changed_config_changes_the_pods_checksum():
    def checksum(values: dict[str, Any]) -> str | None:
        pod = by_kind(render(values))["Deployment"]["spec"]["template"]["metadata"]
        return pod.get("annotations", {}).get("checksum/config")

    base = checksum({})
    assert base == checksum({"replicaCount": 5})  # only the config moves it
    changed = by_kind(render())["ConfigMap"]["data"]["specroute.toml"].replace("interval_s = 1.0", "interval_s = 2.0")
    assert checksum({"config": changed}) not in (None, base)
    assert checksum({"rollOnConfigChange": False}) is None


def test_backend_keys_reach_a_config_that_names_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The documented path: a Secret of variables (backendKeys.existingSecret) and a backend that names
    one with api_key_env. The config loads when the variable is there and names it when not."""
    config = (
        '[gateway]\nlisten = "0.0.0.0:8000"\n\n[[backends]]\nname = "a"\nurl = "http://sglang-a:30000"\n'
        'model = "m"\napi_key_env = "SGLANG_A_KEY"\n'
    )
    docs = by_kind(render({"config": config, "backendKeys": {"existingSecret": "sglang-keys"}}))
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "sglang-keys"}}]
    path = tmp_path / "specroute.toml"
    path.write_text(docs["ConfigMap"]["data"]["specroute.toml"])
    monkeypatch.delenv("SGLANG_A_KEY", raising=False)
    with pytest.raises(ConfigError, match="SGLANG_A_KEY is not set"):
        load_config(path)
    monkeypatch.setenv("SGLANG_A_KEY", "sk-a")
    assert load_config(path).backend_specs()[0].api_key == "sk-a"
    assert "envFrom" not in by_kind(render())["Deployment"]["spec"]["template"]["spec"]["containers"][0]
