"""spec.disaggregation: each role its own Deployment, labelled with its role and started with the P/D
KV connector at the pod's address, with its own engine settings, resources and autoscaling on its own
pods; the service's Service and PDB select both roles; the router runs in its P/D mode, its
arguments read by the real router's own parser as meant; the status speaks for both roles."""

from __future__ import annotations

import argparse
import json

import pytest

from argosy.operator.disaggregation import disaggregated_status
from argosy.operator.reconcile import desired_objects
from argosy.server.api.serve_command import add_serve_args, server_config
from tests.operator.test_builders import OWNER, spec_of

vllm_router_args = pytest.importorskip("vllm_router.router_args")


def built() -> dict[tuple[str, str], dict]:
    return {(kind.kind, obj["metadata"]["name"]): obj for kind, obj in desired_objects(OWNER, spec_of("disaggregated"))}


def serve_settings(deployment: dict):
    """What `argosy serve` makes of the role's container arguments, $(POD_IP) as the kubelet expands it."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [arg.replace("$(POD_IP)", "10.1.2.3") for arg in container["args"][1:]]
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return server_config(parser.parse_args(args)).engine, container


def test_each_role_is_a_deployment_of_its_own_with_the_kv_connector_at_the_pods_address():
    objects = built()
    assert ("Deployment", "svc") not in objects
    prefill, decode = objects["Deployment", "svc-prefill"], objects["Deployment", "svc-decode"]
    for role, deployment in (("prefill", prefill), ("decode", decode)):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector["argosy.dev/role"] == role
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        engine, container = serve_settings(deployment)
        transfer = engine.kv_transfer
        assert (transfer.kv_connector, transfer.kv_role) == ("NixlConnector", "kv_both")
        extra = transfer.kv_connector_extra_config
        assert extra == {"side_channel_host": "10.1.2.3", "side_channel_port": 5700, "hold_timeout": 60,
                         "pull_timeout": 30}  # fmt: skip
        assert {"name": "kv-transfer", "containerPort": 5700, "protocol": "TCP"} in container["ports"]
        assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    # Each role's own settings, the rest the service's.
    assert serve_settings(prefill)[0].max_num_seqs == 16 and serve_settings(decode)[0].max_num_seqs == 512
    assert serve_settings(prefill)[0].max_num_batched_tokens == 16384
    assert prefill["spec"]["replicas"] == 2 and "replicas" not in decode["spec"]  # the decode role is KEDA's
    assert serve_settings(decode)[1]["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "64Gi"}
    assert serve_settings(prefill)[1]["resources"]["limits"] == {"nvidia.com/gpu": 1}


def test_the_decode_roles_autoscaling_reads_and_scales_its_own_pods():
    objects = built()
    assert ("ScaledObject", "svc-prefill") not in objects and ("ScaledObject", "svc") not in objects
    scaled = objects["ScaledObject", "svc-decode"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "svc-decode" and scaled["minReplicaCount"] == 4
    query = scaled["triggers"][0]["metadata"]["query"]
    assert 'pod=~"svc-decode-[a-z0-9]{1,10}-[a-z0-9]{5}"' in query


def test_the_service_and_its_budget_select_both_roles():
    objects = built()
    for selector in (objects["Service", "svc"]["spec"]["selector"],
                     objects["PodDisruptionBudget", "svc"]["spec"]["selector"]["matchLabels"]):  # fmt: skip
        for role in ("prefill", "decode"):
            labels = objects["Deployment", f"svc-{role}"]["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items()


def test_the_router_runs_in_its_pd_mode_finding_each_role_by_its_labels():
    objects = built()
    (container,) = objects["Deployment", "svc-router"]["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    vllm_router_args.RouterArgs.add_cli_args(parser)
    args = vllm_router_args.RouterArgs.from_cli_args(parser.parse_args(container["args"]))
    assert args.vllm_pd_disaggregation and args.service_discovery and args.policy == "round_robin"
    for role in ("prefill", "decode"):
        labels = objects["Deployment", f"svc-{role}"]["spec"]["selector"]["matchLabels"]
        assert getattr(args, f"{role}_selector") == labels
    assert args.prefill_selector != args.decode_selector


def deployment(ready: int, wanted: int) -> dict:
    status = {"replicas": wanted, "readyReplicas": ready, "updatedReplicas": wanted, "availableReplicas": ready,
              "observedGeneration": 1}  # fmt: skip
    return {"metadata": {"generation": 1}, "spec": {"replicas": wanted}, "status": status}


def test_the_status_is_ready_when_both_roles_are_and_counts_each():
    spec = spec_of("disaggregated")
    live = {"prefill": deployment(2, 2), "decode": deployment(4, 4)}
    status = disaggregated_status(OWNER, spec, live, {"prefill": [], "decode": []}, None, [], "2026-12-05T00:00:00Z")
    assert status["conditions"][0]["status"] == "True"
    assert (status["replicas"], status["readyReplicas"]) == (6, 6)
    assert status["roles"]["prefill"] == {"replicas": 2, "readyReplicas": 2, "reason": "Available"}
    live["prefill"] = deployment(0, 2)  # no prefill pod is ready: the service is not
    status = disaggregated_status(OWNER, spec, live, {"prefill": [], "decode": []}, None, [], "2026-12-05T00:00:00Z")
    assert status["conditions"][0]["status"] == "False" and status["roles"]["decode"]["reason"] == "Available"
    assert status["roles"]["prefill"]["readyReplicas"] == 0 and "0/2" in status["conditions"][0]["message"]
    assert json.dumps(status)  # plain data, as the status subresource takes it
