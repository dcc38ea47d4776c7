"""The operator's whole lifecycle against the API emulator, kopf running in-process."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from tests.operator.cluster import (
    AIS,
    CONFIG_MAPS,
    DEPLOYMENTS,
    NS,
    PDBS,
    SCALED_OBJECTS,
    SERVICES,
    declare_resources,
    eventually,
    from_operator,
    inference_service,
    live,
    mark_deployment_ready,
    no_reconcile_running,
    patch,
    path,
    ready_condition,
    reconciles_since,
    running_operator,
    writes,
)

AUTOSCALED = {"autoscaling": {"maxReplicas": 4, "prometheusAddress": "http://prometheus.monitoring:9090"}}


async def create(cluster, body) -> dict:
    response = await cluster.post(path(AIS), json=body)
    assert response.status == 200, await response.text()
    return await response.json()


def event_reasons(cluster, kind: str) -> set[str]:
    return {
        e.get("reason")
        for (resource, _, _), e in cluster.objects.items()
        if resource.plural == "events" and e.get("type") == kind and e.get("involvedObject", {}).get("name") == "llama"
    }


def retry_record(body: dict) -> dict | None:
    """kopf's progress record of the reconcile handler, once it has scheduled a retry."""
    records = [
        json.loads(v)
        for k, v in body["metadata"].get("annotations", {}).items()
        if k.startswith("argosy.dev/reconcile_service")
    ]
    return next((r for r in records if r.get("delayed")), None)


def container(cluster) -> dict:
    return live(cluster, DEPLOYMENTS, "llama")["spec"]["template"]["spec"]["containers"][0]


async def test_create_builds_owned_objects_and_status_follows_the_deployment(cluster):
    async with running_operator():
        uid = (await create(cluster, inference_service(**AUTOSCALED)))["metadata"]["uid"]
        for resource in (DEPLOYMENTS, SERVICES, PDBS, SCALED_OBJECTS):
            obj = await eventually(lambda r=resource: live(cluster, r, "llama"))
            assert obj["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "argosy.dev/v1alpha1",
                    "kind": "InferenceService",
                    "name": "llama",
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        status = await eventually(lambda: live(cluster, AIS, "llama").get("status"))
        assert ready_condition(live(cluster, AIS, "llama"))["status"] == "False"
        assert status["url"] == f"http://llama.{NS}.svc:8000/v1"
        assert status["selector"] == "app.kubernetes.io/name=argosy,app.kubernetes.io/instance=llama"
        assert "finalizers" not in live(cluster, AIS, "llama")["metadata"]  # deletion is the GC's job

        await mark_deployment_ready(cluster, "llama", ready=1)
        ready = await eventually(
            lambda: (
                ready_condition(live(cluster, AIS, "llama"))["status"] == "True"
                and live(cluster, AIS, "llama")["status"]
            )
        )
        assert ready["readyReplicas"] == 1 and ready["observedGeneration"] == 1
        assert ready_condition(live(cluster, AIS, "llama"))["reason"] == "Available"
        await eventually(lambda: "Available" in event_reasons(cluster, "Normal"))
        assert "Reconciled" in event_reasons(cluster, "Normal")


async def test_spec_update_rolls_the_deployment_and_drift_is_put_back(cluster):
    async with running_operator():
        await create(cluster, inference_service())
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama"))
        assert "--max-num-seqs" in container(cluster)["args"]
        await patch(cluster, AIS, "llama", {"spec": {"engine": {"maxNumSeqs": 64}, "image": "argosy:2"}})
        await eventually(lambda: container(cluster)["image"] == "argosy:2")
        args = container(cluster)["args"]
        assert args[args.index("--max-num-seqs") + 1] == "64"
        assert live(cluster, DEPLOYMENTS, "llama")["metadata"]["generation"] == 2

        # Someone edits the Deployment by hand: the operator puts its spec back.
        await patch(
            cluster, DEPLOYMENTS, "llama", {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 1}}}}
        )
        await eventually(
            lambda: (
                live(cluster, DEPLOYMENTS, "llama")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 80
            )
        )
        await patch(cluster, SERVICES, "llama", {"spec": {"ports": [{"name": "x", "port": 1}]}})
        await eventually(lambda: live(cluster, SERVICES, "llama")["spec"]["ports"][0]["port"] == 8000)


async def test_fields_removed_from_the_spec_leave_the_deployment(cluster):
    scheduling = {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "priorityClassName": "high",
        "nodeSelector": {"zone": "a"},
    }
    async with running_operator():
        await create(cluster, inference_service(**scheduling))
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama")["spec"]["template"]["spec"]["priorityClassName"])
        await patch(
            cluster,
            AIS,
            "llama",
            {"spec": {"tolerations": None, "priorityClassName": None, "nodeSelector": {"zone": None, "rack": "7"}}},
        )
        pod = await eventually(
            lambda: (
                (p := live(cluster, DEPLOYMENTS, "llama")["spec"]["template"]["spec"]) and "tolerations" not in p and p
            )
        )
        assert "priorityClassName" not in pod
        assert pod["nodeSelector"] == {"argosy.dev/model-llama-3-8b": "true", "rack": "7"}


async def test_replicas_follow_the_spec_without_autoscaling_and_keda_otherwise(cluster):
    async with running_operator():
        await create(cluster, inference_service(replicas=2))
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama")["spec"]["replicas"] == 2)
        assert live(cluster, SCALED_OBJECTS, "llama") is None
        await patch(cluster, AIS, "llama", {"spec": {"replicas": 3}})  # what `kubectl scale` does
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama")["spec"]["replicas"] == 3)

        await patch(cluster, AIS, "llama", {"spec": AUTOSCALED})
        scaled = await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama"))
        assert scaled["spec"]["maxReplicaCount"] == 4
        since = len(list(cluster))
        await patch(cluster, DEPLOYMENTS, "llama", {"spec": {"replicas": 4}})  # KEDA's HPA scales up
        await eventually(lambda: reconciles_since(cluster, since), what="the reconcile the change triggers")
        assert live(cluster, DEPLOYMENTS, "llama")["spec"]["replicas"] == 4  # the operator does not fight it
        assert not [r for r in writes(cluster, since) if from_operator(r) and r.resource.plural == "deployments"]

        await patch(cluster, AIS, "llama", {"spec": {"autoscaling": None, "replicas": 1}})
        await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama") is None)
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama")["spec"]["replicas"] == 1)


async def test_an_adapter_change_reaches_the_config_map_and_rolls_nothing(cluster):
    adapters = [{"name": "sql", "path": "adapters/sql"}]
    async with running_operator():
        await create(cluster, inference_service(adapters=adapters))
        config_map = await eventually(lambda: live(cluster, CONFIG_MAPS, "llama"))
        assert '"/models/adapters/sql"' in config_map["data"]["adapters.json"]
        assert "--enable-lora" in container(cluster)["args"]
        generation = live(cluster, DEPLOYMENTS, "llama")["metadata"]["generation"]
        since = len(list(cluster))
        await patch(cluster, AIS, "llama", {"spec": {"adapters": [*adapters, {"name": "chat", "path": "adapters/c"}]}})
        await eventually(lambda: '"chat"' in live(cluster, CONFIG_MAPS, "llama")["data"]["adapters.json"])
        assert live(cluster, DEPLOYMENTS, "llama")["metadata"]["generation"] == generation
        assert not [r for r in writes(cluster, since) if from_operator(r) and r.resource.plural == "deployments"]
        await patch(cluster, AIS, "llama", {"spec": {"adapters": None}})  # LoRA off: a rollout, and no ConfigMap
        await eventually(lambda: live(cluster, CONFIG_MAPS, "llama") is None)
        await eventually(lambda: "--enable-lora" not in container(cluster)["args"])


async def test_deletion_removes_everything_through_owner_references(cluster):
    async with running_operator():
        await create(cluster, inference_service(**AUTOSCALED))
        await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama"))
        response = await cluster.delete(path(AIS, "llama"))
        assert response.status == 200
        for resource in (AIS, DEPLOYMENTS, SERVICES, PDBS, SCALED_OBJECTS):
            await eventually(lambda r=resource: live(cluster, r, "llama") is None)


async def test_operator_restart_neither_duplicates_nor_churns(cluster):
    async with running_operator():
        await create(cluster, inference_service(**AUTOSCALED))
        await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama"))
        await mark_deployment_ready(cluster, "llama", ready=1)
        await eventually(lambda: ready_condition(live(cluster, AIS, "llama"))["status"] == "True")
    await no_reconcile_running("llama")
    before = len(list(cluster))
    versions = {
        r: live(cluster, r, "llama")["metadata"]["resourceVersion"]
        for r in (AIS, DEPLOYMENTS, SERVICES, PDBS, SCALED_OBJECTS)
    }
    async with running_operator():
        # The resume handler and the first sight of each of the four owned objects: two runs at
        # least (those made while one runs fold into one more).
        await eventually(lambda: reconciles_since(cluster, before) >= 2, what="the reconciles of a restart")
        await no_reconcile_running("llama")
    assert writes(cluster, before) == []
    assert {r: live(cluster, r, "llama")["metadata"]["resourceVersion"] for r in versions} == versions


async def test_a_deployment_we_do_not_own_is_left_alone_and_reported(cluster):
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": NS},
        "spec": {
            "replicas": 7,
            "selector": {"matchLabels": {"app": "other"}},
            "template": {
                "metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "c", "image": "other"}]},
            },
        },
    }
    await cluster.post(path(DEPLOYMENTS), json=foreign)
    async with running_operator():
        await create(cluster, inference_service())
        condition = await eventually(lambda: ready_condition(live(cluster, AIS, "llama")))
        assert condition["status"] == "False" and condition["reason"] == "ResourceConflict"
        assert "not owned" in condition["message"]
        assert live(cluster, DEPLOYMENTS, "llama")["spec"]["replicas"] == 7
        assert live(cluster, SERVICES, "llama") is not None  # the rest is still reconciled
        stalled = next(c for c in live(cluster, AIS, "llama")["status"]["conditions"] if c["type"] == "Stalled")
        assert stalled["status"] == "True"


async def test_missing_keda_is_reported_retried_with_backoff_and_recovers(cluster):
    cluster.resources.clear()
    declare_resources(cluster)

    def attempts() -> int:
        return sum(1 for r in cluster if r.method.value == "POST" and "/scaledobjects" in str(r.url))

    async with running_operator():
        since = len(list(cluster))
        await create(cluster, inference_service(**AUTOSCALED))
        condition = await eventually(lambda: ready_condition(live(cluster, AIS, "llama")))
        assert condition["reason"] == "KEDANotInstalled" and "KEDA" in condition["message"]
        assert live(cluster, DEPLOYMENTS, "llama") is not None  # the rest is reconciled regardless
        await eventually(lambda: "KEDANotInstalled" in event_reasons(cluster, "Warning"))
        # The create handler and the first sight of the three objects it created: two runs at
        # least (those made while one runs fold into one more), each tried once.
        progress = await eventually(lambda: retry_record(live(cluster, AIS, "llama")))
        await no_reconcile_running("llama")
        tried = attempts()
        assert tried == reconciles_since(cluster, since) >= 2
        assert progress["retries"] == 1  # it waits for its retry delay: no hot loop
        assert datetime.fromisoformat(progress["delayed"]) - datetime.fromisoformat(progress["started"]) >= timedelta(
            seconds=9
        )
        declare_resources(cluster, "keda")  # KEDA gets installed
        await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama"), timeout=30)
        assert attempts() == tried + 1  # nothing tried between the failures and the retry
        await eventually(lambda: ready_condition(live(cluster, AIS, "llama"))["reason"] == "Progressing")


async def test_an_api_error_is_reported_retried_and_survived(cluster):
    cluster.failures[("POST", "poddisruptionbudgets")] = 500
    async with running_operator():
        await create(cluster, inference_service())
        condition = await eventually(lambda: ready_condition(live(cluster, AIS, "llama")))
        assert condition["reason"] == "APIError" and "PodDisruptionBudget" in condition["message"]
        assert "injected failure" in condition["message"]  # the API server's own words
        assert live(cluster, DEPLOYMENTS, "llama") is not None and live(cluster, SERVICES, "llama") is not None
        await eventually(lambda: "APIError" in event_reasons(cluster, "Warning"))
        cluster.failures.clear()  # the API server recovers; the retry (after 10 s) completes the job
        await eventually(lambda: live(cluster, PDBS, "llama"), timeout=30)
        await eventually(lambda: ready_condition(live(cluster, AIS, "llama"))["reason"] == "Progressing")
