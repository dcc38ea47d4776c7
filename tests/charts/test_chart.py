"""The Helm chart: lints clean, renders valid objects for Kubernetes 1.29-1.34 with every
option, carries the CRD unchanged, grants exactly the operator's RBAC table, and its values
schema rejects bad values."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

import argosy
from argosy.operator import rbac
from argosy.operator.labels import labels as pod_labels
from argosy.operator.labels import router_labels
from argosy.operator.main import add_operator_args
from argosy.operator.model_cache.agent.main import add_agent_args, parse_quantity
from argosy.operator.model_cache.agent.rbac import AGENT_RULES
from argosy.operator.owner import Owner
from argosy.operator.spec import DEFAULT_IMAGE
from tests.operator.crd_schema import openapi_schema, to_jsonschema

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "argosy"
DEFAULT_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]
OPTIONS = {
    "defaults": {},
    "pod-monitor": {
        "metrics": {"podMonitor": {"enabled": True, "namespace": "monitoring", "labels": {"release": "prometheus"}}}
    },
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "interval": "30s"}}},
    "dashboard": {"grafana": {"dashboard": {"enabled": True}}},
    "namespace-scope": {
        "rbac": {"scope": "namespace"},
        "operator": {"namespaces": ["llm", "batch"]},
        "metrics": {"podMonitor": {"enabled": True}},
    },
    "standalone": {"replicaCount": 1, "operator": {"peering": {"enabled": False}, "logFormat": "plain"}},
    "no-rbac": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}},
    "agent": {
        "agent": {
            "cacheRoot": "/mnt/nvme/argosy",
            "quota": "800Gi",
            "libraryClaims": ["models", "finetunes"],
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-node-critical",
        }
    },
    "no-agent": {"agent": {"enabled": False}},
    "scheduling": {
        "image": {"tag": "0.2.0", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "priorityClassName": "system-cluster-critical",
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                    ]
                }
            }
        },
        "podAnnotations": {"a": "b"},
        "podLabels": {"team": "ml"},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
    },
}


def render(values: dict) -> list[dict]:
    with helm_python.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name="argosy", namespace="argosy-system")
    return [
        doc for path, text in sorted(files.items()) if path.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc
    ]


def crd_schema(name: str) -> dict:
    with helm_python.Chart.load(str(CHART)) as chart:
        crds = [doc for c in chart.crds for doc in yaml.safe_load_all(c["data"]) if doc]
    return next(c for c in crds if c["metadata"]["name"] == name)


@pytest.mark.parametrize("version", VERSIONS)
def test_lint_is_clean(version):
    result = helm_python.lint(str(CHART), kube_version=f"v{version}.0", strict=True)
    assert result["errors"] == [] and result["messages"] == []


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_rendered_object_is_valid(option):
    docs = render(OPTIONS[option])
    assert {d["kind"] for d in docs} >= {"Deployment"}
    for doc in docs:
        group = doc["apiVersion"].split("/")[0]
        if group == "kopf.dev":
            jsonschema.validate(doc, to_jsonschema(openapi_schema(crd_schema(f"{doc['kind'].lower()}s.kopf.dev"))))
        elif group == "monitoring.coreos.com":
            check_monitor(doc, OPTIONS[option])
        else:
            for version in VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def check_monitor(doc: dict, values: dict) -> None:
    """The monitor selects the inference pods the operator labels, on their `http` port, or the
    routers it runs, on their `metrics` port (never both), at the interval the values ask for."""
    wanted = doc["spec"]["selector"]["matchLabels"]
    owner = Owner(name="x", namespace="y", uid="u")
    router = doc["metadata"]["name"].endswith("-router")
    selected = router_labels(owner) if router else pod_labels(owner)
    assert wanted.items() <= selected.items()
    assert not wanted.items() <= (pod_labels(owner) if router else router_labels(owner)).items()
    key = {"PodMonitor": "podMonitor", "ServiceMonitor": "serviceMonitor"}[doc["kind"]]
    interval = values["metrics"][key].get("interval", DEFAULT_VALUES["metrics"][key]["interval"])
    endpoints = doc["spec"]["podMetricsEndpoints" if key == "podMonitor" else "endpoints"]
    port = "metrics" if router else "http"
    assert endpoints == [{"port": port, "path": "/metrics", "interval": interval}]


def test_the_chart_carries_the_crd_unchanged():
    with helm_python.Chart.load(str(CHART)) as chart:
        shipped = {c["name"]: c["data"] for c in chart.crds}
    assert (
        shipped["crds/inferenceservices.argosy.dev.yaml"]
        == (ROOT / "crds" / "inferenceservices.argosy.dev.yaml").read_text()
    )


def rules_of(docs: list[dict], kind: str, name: str | None = None) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def table(*tables) -> set[tuple[str, str, str]]:
    return {(g, r, v) for t in tables for g, resources, verbs in t for r in resources for v in verbs}


def test_rbac_is_exactly_the_operators_table():
    cluster = render({})
    assert rules_of(cluster, "ClusterRole", "argosy") == table(
        rbac.RULES, rbac.ADMISSION_RULES, rbac.ROUTER_RULES, rbac.PEERING_RULES, rbac.CLUSTER_RULES, rbac.NODE_RULES
    )
    scoped = render(OPTIONS["namespace-scope"])
    roles = [d for d in scoped if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["batch", "llm"]
    for role in roles:
        assert rules_of([role], "Role") == table(
            rbac.RULES, rbac.ADMISSION_RULES, rbac.ROUTER_RULES, rbac.PEERING_RULES
        )
    assert rules_of(scoped, "ClusterRole", "argosy-discovery") == table(rbac.CLUSTER_RULES, rbac.NODE_RULES)
    binding = next(d for d in cluster if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "argosy")
    account = next(d for d in cluster if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "argosy")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "argosy-system"}
    ]


def operator_container(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_operator_deployment_runs_argosy_operator_hardened():
    container = operator_container(render(OPTIONS["namespace-scope"]))
    assert container["command"] == ["argosy"] and container["args"][0] == "operator"
    parser = argparse.ArgumentParser()
    add_operator_args(parser)
    args = parser.parse_args(container["args"][1:])
    assert args.namespace == ["llm", "batch"] and args.peering == "argosy" and not args.standalone
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert "--standalone" in operator_container(render(OPTIONS["standalone"]))["args"]


def test_the_agent_runs_on_every_selected_node_with_the_cache_root_at_its_host_path():
    docs = render(OPTIONS["agent"])
    [daemon] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = daemon["spec"]["template"]["spec"]
    container = pod["containers"][0]
    parser = argparse.ArgumentParser()
    add_agent_args(parser)
    args = parser.parse_args(container["args"][1:])
    assert container["args"][0] == "agent" and args.cache_root == "/mnt/nvme/argosy" and args.quota == "800Gi"
    assert parse_quantity(args.quota) == 800 * 2**30 and args.library_root == "/libraries"
    [cache] = [v for v in pod["volumes"] if v["name"] == "cache"]
    assert cache["hostPath"] == {"path": "/mnt/nvme/argosy", "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["cache"]["mountPath"] == "/mnt/nvme/argosy"  # what the inference pods' hostPath names
    assert mounts["library-models"] == {"name": "library-models", "mountPath": "/libraries/models", "readOnly": True}
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"models", "finetunes"}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP"}
    assert (
        pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    )
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "--cache-root=/mnt/nvme/argosy" in operator_container(docs)["args"]  # the operator mounts the same root
    assert rules_of(docs, "ClusterRole", "argosy-agent") == table(AGENT_RULES)
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "argosy-agent")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == "argosy-agent"
    assert not [d for d in render(OPTIONS["no-agent"]) if "agent" in d["metadata"]["name"]]


def test_default_images_agree():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == argosy.__version__
    assert operator_container(render({}))["image"] == DEFAULT_IMAGE
    crd = openapi_schema(crd_schema("inferenceservices.argosy.dev"))
    assert crd["properties"]["spec"]["properties"]["image"]["default"] == DEFAULT_IMAGE


BAD_VALUES = [
    {"replicaCount": -1},
    {"replicaCount": "two"},
    {"unknownKey": True},
    {"operator": {"watchAll": True}},
    {"rbac": {"scope": "everywhere"}},
    {"operator": {"logFormat": "xml"}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"metrics": {"podMonitor": {"interval": "soon"}}},
    {"operator": {"namespaces": ["Not_A_Namespace"]}},
    {"agent": {"quota": "lots"}},
    {"agent": {"cacheRoot": "relative/path"}},
]


@pytest.mark.parametrize("values", BAD_VALUES, ids=[json.dumps(v) for v in BAD_VALUES])
def test_values_schema_rejects_bad_values(values):
    schema = json.loads((CHART / "values.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(DEFAULT_VALUES | values, schema)
    with pytest.raises(helm_python.HelmError):
        render(values)


def test_namespace_scope_needs_namespaces():
    with pytest.raises(helm_python.HelmError, match=r"operator\.namespaces"):
        render({"rbac": {"scope": "namespace"}})


def test_values_yaml_satisfies_its_schema_and_every_value_is_described():
    values = DEFAULT_VALUES
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(values, schema)
    assert set(values) <= set(schema["properties"])
    assert all(schema["properties"][key].get("description") for key in values)


def test_dashboard_queries_only_metrics_the_server_exports():
    from argosy.server.api.metrics import ServerMetrics

    exported = {m.name for m in ServerMetrics("m").registry.collect()}
    exported |= {f"{name}_total" for name in exported} | {f"{name}_bucket" for name in exported}
    dashboard = json.loads((CHART / "dashboards" / "argosy.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"argosy_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
    configmap = next(d for d in render(OPTIONS["dashboard"]) if d["kind"] == "ConfigMap")
    assert json.loads(configmap["data"]["argosy.json"]) == dashboard
