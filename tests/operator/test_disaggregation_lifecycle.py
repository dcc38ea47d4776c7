"""spec.disaggregation against the API emulator, kopf running in-process: turned on, the service's one
Deployment gives way to a Deployment per role and the status counts each role; ready only once both
are; turned off, the roles give way to the one Deployment again."""

from __future__ import annotations

from tests.operator.cluster import (
    AIS,
    DEPLOYMENTS,
    eventually,
    inference_service,
    live,
    mark_deployment_ready,
    patch,
    running_operator,
)
from tests.operator.test_lifecycle import create

ROUTER = {"router": {"policy": "round_robin"}}
ROLES = {"prefill": {"replicas": 1}, "decode": {"replicas": 2}}


def status(cluster) -> dict:
    return live(cluster, AIS, "llama").get("status") or {}


def ready(cluster) -> str | None:
    return next((c["status"] for c in status(cluster).get("conditions", []) if c["type"] == "Ready"), None)


async def test_disaggregation_turned_on_and_off_swaps_the_deployments(cluster):
    async with running_operator():
        await create(cluster, inference_service(routing=ROUTER))
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama"), what="the one Deployment")
        await patch(cluster, AIS, "llama", {"spec": {"disaggregation": ROLES}})
        for role in ("prefill", "decode"):
            await eventually(lambda r=role: live(cluster, DEPLOYMENTS, f"llama-{r}"), what=f"the {role} Deployment")
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama") is None, what="the one Deployment to go")
        assert live(cluster, DEPLOYMENTS, "llama-decode")["spec"]["replicas"] == 2
        await mark_deployment_ready(cluster, "llama-decode", ready=2)
        await eventually(lambda: status(cluster).get("roles", {}).get("decode", {}).get("readyReplicas") == 2)
        assert ready(cluster) == "False" and status(cluster)["roles"]["prefill"]["readyReplicas"] == 0
        await mark_deployment_ready(cluster, "llama-prefill", ready=1)
        await eventually(lambda: ready(cluster) == "True", what="ready with both roles")
        assert (status(cluster)["replicas"], status(cluster)["readyReplicas"]) == (3, 3)
        await patch(cluster, AIS, "llama", {"spec": {"disaggregation": None}})
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama"), what="the one Deployment back")
        for role in ("prefill", "decode"):
            await eventually(lambda r=role: live(cluster, DEPLOYMENTS, f"llama-{r}") is None, what=f"{role} to go")
