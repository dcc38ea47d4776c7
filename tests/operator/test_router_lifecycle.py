"""The router against the API emulator, kopf running in-process: its objects appear with the
service, RouterReady follows its Deployment, a deleted router Deployment is put back (its loss is
repaired), and the status names the URL through it."""

from __future__ import annotations

from tests.operator.cluster import (
    AIS,
    DEPLOYMENTS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    eventually,
    inference_service,
    live,
    mark_deployment_ready,
    path,
    running_operator,
)
from tests.operator.test_lifecycle import create


def router_ready(cluster) -> dict | None:
    conditions = (live(cluster, AIS, "llama").get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "RouterReady"), None)


async def test_the_router_comes_up_reports_ready_and_is_repaired_when_deleted(cluster):
    async with running_operator():
        await create(cluster, inference_service(routing={"router": {"policy": "kv_aware"}}))
        for resource in (DEPLOYMENTS, SERVICES, SERVICE_ACCOUNTS, ROLES, ROLE_BINDINGS):
            await eventually(lambda r=resource: live(cluster, r, "llama-router"), what=f"the router's {resource}")
        await eventually(lambda: (router_ready(cluster) or {}).get("reason") == "RouterProgressing")
        await mark_deployment_ready(cluster, "llama-router", ready=1)
        await eventually(lambda: (router_ready(cluster) or {}).get("status") == "True")
        status = live(cluster, AIS, "llama")["status"]
        assert status["routerUrl"] == "http://llama-router.llm.svc:8000/v1"
        uid = live(cluster, DEPLOYMENTS, "llama-router")["metadata"]["uid"]
        response = await cluster.delete(path(DEPLOYMENTS, "llama-router"))
        assert response.status == 200
        await eventually(
            lambda: (live(cluster, DEPLOYMENTS, "llama-router") or {}).get("metadata", {}).get("uid") not in (None, uid)
        )
        await eventually(lambda: (router_ready(cluster) or {}).get("status") == "False")
