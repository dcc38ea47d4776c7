"""The router the operator runs (spec.routing.router): its objects, which the real router's own argument
parser reads as meant; pods it never mixes up with the servers' (selectors, Service, PDB); the servers'
KV events turned on for kv_aware and their port opened; the tokenizer read from the model cache; and
the RouterReady condition read from its Deployment."""

from __future__ import annotations

import argparse
import json

import pytest

from argosy.operator.deployment import build_deployment, server_args
from argosy.operator.rbac import ROUTER_RULES
from argosy.operator.reconcile import desired_objects
from argosy.operator.router_status import router_condition
from argosy.operator.service import build_pdb, build_service
from tests.operator.test_builders import OWNER, spec_of

vllm_router_args = pytest.importorskip("vllm_router.router_args")


def objects(name: str) -> dict[tuple[str, str], dict]:
    return {(kind.kind, obj["metadata"]["name"]): obj for kind, obj in desired_objects(OWNER, spec_of(name))}


def router_pod(name: str) -> dict:
    return objects(name)["Deployment", "svc-router"]["spec"]["template"]["spec"]


def parsed(args: list[str]):
    parser = argparse.ArgumentParser()
    vllm_router_args.RouterArgs.add_cli_args(parser)
    return vllm_router_args.RouterArgs.from_cli_args(parser.parse_args(args))


def test_the_router_finds_exactly_the_server_pods_by_their_labels():
    built = objects("router-kv-aware")
    server = build_deployment(OWNER, spec_of("router-kv-aware"))
    (container,) = router_pod("router-kv-aware")["containers"]
    args = parsed(container["args"])
    assert container["command"] == ["vllm-router"] and args.policy == "kv_aware" and args.service_discovery
    assert args.selector == server["spec"]["selector"]["matchLabels"]
    assert (args.service_discovery_port, args.service_discovery_namespace, args.port) == (8000, "llm", 8000)
    assert args.prometheus_port == 29000 and args.worker_urls == []  # found, never listed
    router = built["Deployment", "svc-router"]
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    for selector in (
        server["spec"]["selector"]["matchLabels"],
        build_service(OWNER)["spec"]["selector"],
        build_pdb(OWNER, spec_of("router-kv-aware"))["spec"]["selector"]["matchLabels"],
    ):  # the servers' selectors never take in a router pod
        assert not selector.items() <= router_labels.items()
    assert built["Service", "svc-router"]["spec"]["selector"].items() <= router_labels.items()
    assert (
        not built["Service", "svc-router"]["spec"]["selector"].items()
        <= server["spec"]["template"]["metadata"]["labels"].items()
    )
    assert router["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_its_role_lets_it_watch_the_pods_and_nothing_else():
    built = objects("router-kv-aware")
    role, binding = built["Role", "svc-router"], built["RoleBinding", "svc-router"]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert granted == {(g, r, v) for g, rs, vs in ROUTER_RULES for r in rs for v in vs} == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch")
    }  # fmt: skip
    assert binding["roleRef"]["name"] == "svc-router" and binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "svc-router", "namespace": "llm"}
    ]
    assert router_pod("router-kv-aware")["serviceAccountName"] == "svc-router"


def test_kv_aware_turns_the_servers_events_on_and_opens_their_port():
    spec = spec_of("router-kv-aware")
    args = server_args(spec)
    config = json.loads(args[args.index("--kv-events-config") + 1])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
                      "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": ""}  # fmt: skip
    ports = build_deployment(OWNER, spec)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "kv-events", "containerPort": 5557, "protocol": "TCP"} in ports
    assert "--kv-events-config" not in server_args(spec_of("plain-gpu"))
    set_by_hand = server_args(spec_of("router-model-cache"))  # cache_aware: only what the spec asks
    assert json.loads(set_by_hand[set_by_hand.index("--kv-events-config") + 1])["replay_endpoint"] == "tcp://*:6001"
    assert set_by_hand.count("--kv-events-config") == 1


def test_with_a_model_cache_the_router_tokenizes_from_the_nodes_copy():
    pod = router_pod("router-model-cache")
    (container,) = pod["containers"]
    assert {"name": "VLLM_ROUTER_TOKENIZER", "value": "/models"} in container["env"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    model = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model["hostPath"]["path"].endswith("llama-3-8b") and model["hostPath"]["type"] == "Directory"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["ready"]
    assert pod["tolerations"] and container["image"] == "registry.example.com/router:1"
    assert parsed(container["args"]).policy == "cache_aware"
    assert "VLLM_ROUTER_TOKENIZER" not in json.dumps(router_pod("router-kv-aware"))  # the replicas tokenize


@pytest.mark.parametrize(
    ("deployment", "status", "reason"),
    [
        (None, "False", "RouterPending"),
        ({"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}, "True", "RouterAvailable"),
        ({"spec": {"replicas": 1}, "status": {}}, "False", "RouterProgressing"),
        (
            {"spec": {"replicas": 1}, "status": {"conditions": [
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "stuck"}
            ]}},
            "False",
            "RouterProgressDeadlineExceeded",
        ),
    ],
)  # fmt: skip
def test_router_ready_is_read_from_its_deployment(deployment, status, reason):
    condition = router_condition(deployment, 3, [], "2026-01-01T00:00:00Z")
    assert (condition["type"], condition["status"], condition["reason"]) == ("RouterReady", status, reason)
    assert condition["observedGeneration"] == 3
