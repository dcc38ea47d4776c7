"""The RBAC table is exactly what the operator calls: every API request of a full lifecycle
is granted, and every grant is used."""

from __future__ import annotations

from argosy.operator.rbac import NODE_RULES, ROUTER_RULES, RULES
from tests.operator.cluster import (
    AIS,
    CONFIG_MAPS,
    DEPLOYMENTS,
    HTTP_ROUTES,
    INFERENCE_POOLS,
    LEADER_WORKER_SETS,
    MODEL_CACHES,
    NS,
    PDBS,
    ROLE_BINDINGS,
    ROLES,
    SCALED_OBJECTS,
    SERVICE_ACCOUNTS,
    SERVICES,
    calls_made,
    eventually,
    inference_service,
    live,
    mark_deployment_ready,
    patch,
    path,
    running_operator,
)


def granted() -> set[tuple[str, str, str]]:
    rules = RULES + NODE_RULES
    return {(group, resource, v) for group, resources, verbs in rules for resource in resources for v in verbs}


async def test_rbac_rules_equal_the_calls_of_a_full_lifecycle(cluster):
    async with running_operator():
        autoscaling = {"maxReplicas": 3, "prometheusAddress": "http://prometheus:9090"}
        routing = {"endpointPicker": {"name": "llama-epp"}, "route": {"gateway": {"name": "gw"}}}
        adapters = [{"name": "sql", "path": "adapters/sql"}]
        body = inference_service(autoscaling=autoscaling, routing=routing, adapters=adapters)
        await cluster.post(path(AIS), json=body)
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama"))
        await mark_deployment_ready(cluster, "llama", ready=1)
        await patch(cluster, AIS, "llama", {"spec": {"autoscaling": {"maxReplicas": 5}}})
        await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama")["spec"]["maxReplicaCount"] == 5)
        for resource, drift in (
            (SERVICES, {"spec": {"selector": {"app": "x"}}}),
            (PDBS, {"spec": {"maxUnavailable": 0}}),
            (SCALED_OBJECTS, {"spec": {"maxReplicaCount": 99}}),
            (INFERENCE_POOLS, {"spec": {"targetPorts": [{"number": 9999}]}}),
            (HTTP_ROUTES, {"spec": {"parentRefs": [{"name": "other"}]}}),
        ):  # someone's hand edits
            await patch(cluster, resource, "llama", drift)
            await eventually(lambda r=resource, d=drift: _restored(live(cluster, r, "llama")["spec"], d["spec"]))
        await patch(cluster, CONFIG_MAPS, "llama", {"data": {"adapters.json": "[]"}})
        await eventually(lambda: "sql" in live(cluster, CONFIG_MAPS, "llama")["data"]["adapters.json"])
        await patch(cluster, AIS, "llama", {"spec": {"autoscaling": None, "routing": None, "adapters": None}})
        await eventually(lambda: live(cluster, CONFIG_MAPS, "llama") is None)
        await eventually(lambda: "replicas" in live(cluster, DEPLOYMENTS, "llama")["spec"])
        await eventually(lambda: live(cluster, INFERENCE_POOLS, "llama") is None)
        # A router in front of the pods: built, restored when edited, removed when dropped.
        await patch(cluster, AIS, "llama", {"spec": {"routing": {"router": {}}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama-router"))
        for resource, drift in (
            (ROLES, {"rules": []}),
            (ROLE_BINDINGS, {"subjects": []}),
            (SERVICE_ACCOUNTS, {"automountServiceAccountToken": False}),
        ):
            await patch(cluster, resource, "llama-router", drift)
            await eventually(
                lambda r=resource, d=drift: all(live(cluster, r, "llama-router")[k] != v for k, v in d.items())
            )
        await patch(cluster, AIS, "llama", {"spec": {"routing": None}})
        await eventually(lambda: live(cluster, SERVICE_ACCOUNTS, "llama-router") is None)
        # A model spanning pods: its Deployment replaced by a LeaderWorkerSet, which goes when it fits one pod.
        stages = {"engine": {"pipelineParallelSize": 2}}
        await patch(cluster, AIS, "llama", {"spec": stages})
        await eventually(lambda: live(cluster, LEADER_WORKER_SETS, "llama") and not live(cluster, DEPLOYMENTS, "llama"))
        await patch(cluster, LEADER_WORKER_SETS, "llama", {"spec": {"replicas": 7}})
        await eventually(lambda: live(cluster, LEADER_WORKER_SETS, "llama")["spec"]["replicas"] == 1)
        await patch(cluster, AIS, "llama", {"spec": {"engine": {"pipelineParallelSize": 1}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama") and not live(cluster, LEADER_WORKER_SETS, "llama"))
        # A service whose checkpoint a ModelCache holds on the nodes.
        await cluster.post("/api/v1/nodes", json={"metadata": {"name": "node-a"}})
        cache = {"source": {"http": {"url": "https://models.example/llama"}}, "manifestPath": "manifest.json"}
        await cluster.post(path(MODEL_CACHES), json={"metadata": {"name": "llama", "namespace": NS}, "spec": cache})
        await eventually(lambda: live(cluster, MODEL_CACHES, "llama")["status"]["desiredNodes"] == 1)
        cached = inference_service("cached", model={"name": "llama", "cacheRef": {"name": "llama"}})
        await cluster.post(path(AIS), json=cached)
        await eventually(lambda: live(cluster, AIS, "cached")["status"]["modelCache"]["readyNodes"] == 0)
        await eventually(lambda: granted() <= calls_made(cluster), what="every granted call")
    assert calls_made(cluster) <= granted(), calls_made(cluster) - granted()
    delegated = {(g, r, v) for g, resources, verbs in ROUTER_RULES for r in resources for v in verbs}
    assert delegated - granted() == {("", "pods", "get")}  # held only to grant it to the router
    # The Deployment, Service and pod watches were filtered by the API server.
    watches = [
        r
        for r in cluster
        if r.params.get("watch") == "true"
        and r.resource is not None
        and r.resource.plural in ("deployments", "services", "pods", "poddisruptionbudgets")
    ]
    assert watches and all(
        r.params.get("labelSelector") == "app.kubernetes.io/managed-by=argosy-operator" for r in watches
    )


def _restored(spec: dict, drift: dict) -> bool:
    return all(
        spec.get(k) != v and not (isinstance(v, dict) and set(v) & set(spec.get(k) or {})) for k, v in drift.items()
    )
