"""A model larger than one pod: its replicas as LeaderWorkerSet groups. The builder's leader and
worker templates (the ranks' flags from LWS's own variables, no probes on the workers), the
Service and the pool on the leaders only, KEDA scaling the groups; and in the API emulator the
service created, scaled, reported Ready from the groups' status and deleted."""

from __future__ import annotations

from argosy.operator.leader_worker_set import build_leader_worker_set, pods_per_group
from argosy.operator.owner import Owner
from argosy.operator.reconcile import desired_objects
from tests.operator.cluster import (
    AIS,
    DEPLOYMENTS,
    LEADER_WORKER_SETS,
    SERVICES,
    eventually,
    inference_service,
    live,
    mark_deployment_ready,
    patch,
    path,
    running_operator,
)
from tests.operator.crd_schema import add_on_rejections
from tests.operator.test_builders import spec_of

OWNER = Owner(name="svc", namespace="llm", uid="2f0c8a64-7c35-4b0c-9a51-0d2b7c3f1e11", generation=3)


def test_each_replica_is_a_group_of_a_pod_per_stage():
    spec = spec_of("across-nodes")  # 8 ranks a stage, 2 stages, 8 GPUs a pod
    assert pods_per_group(spec) == 2
    assert pods_per_group(spec_of("pipeline-in-one-pod")) == 1  # 4 GPUs hold both stages of 2
    lws = build_leader_worker_set(OWNER, spec)
    assert add_on_rejections(lws) == []
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert "replicas" not in lws["spec"]  # KEDA's
    leader, worker = (template[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    ranks = ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
    for container in (leader, worker):
        assert all(flag in container["args"] for flag in ranks)
        assert container["args"][container["args"].index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert container["args"][container["args"].index("--nnodes") + 1] == "2"
    assert leader["args"][leader["args"].index("--node-rank") + 1] == "0" and "--headless" not in leader["args"]
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert "--headless" in worker["args"]
    assert "readinessProbe" in leader and not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    annotations = template["workerTemplate"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations  # a worker serves no /metrics
    assert {p["containerPort"] for p in leader["ports"]} >= {29500, 29501}


def test_the_api_the_metrics_and_the_scaling_are_the_leaders():
    objects = {kind.kind: obj for kind, obj in desired_objects(OWNER, spec_of("across-nodes"))}
    assert "Deployment" not in objects
    leaders = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert leaders.items() <= objects["Service"]["spec"]["selector"].items()
    assert leaders.items() <= objects["InferencePool"]["spec"]["selector"]["matchLabels"].items()
    scaled = objects["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                        "name": "svc"}  # fmt: skip
    assert 'pod=~"svc-[0-9]{1,5}"' in scaled["triggers"][0]["metadata"]["query"]  # leaders are <name>-<group>


async def test_created_scaled_ready_and_deleted_in_the_emulator(cluster):
    body = inference_service(engine={"pipelineParallelSize": 2}, replicas=1)
    async with running_operator():
        response = await cluster.post(path(AIS), json=body)
        assert response.status == 200, await response.text()
        lws = await eventually(lambda: live(cluster, LEADER_WORKER_SETS, "llama"))
        assert lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert live(cluster, DEPLOYMENTS, "llama") is None
        await patch(cluster, AIS, "llama", {"spec": {"replicas": 3}})
        await eventually(lambda: live(cluster, LEADER_WORKER_SETS, "llama")["spec"]["replicas"] == 3)
        await mark_deployment_ready(cluster, "llama", ready=3, resource=LEADER_WORKER_SETS)
        ready = await eventually(lambda: _ready(cluster))
        assert ready["reason"] == "Available" and "3/3" in ready["message"]
        service = live(cluster, SERVICES, "llama")
        assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
        response = await cluster.delete(path(AIS, "llama"))
        assert response.status == 200
        await eventually(lambda: live(cluster, LEADER_WORKER_SETS, "llama") is None)


def _ready(cluster):
    conditions = ((live(cluster, AIS, "llama") or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready" and c["status"] == "True"), None)
