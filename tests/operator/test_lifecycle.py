"""The operator's whole lifecycle against the API emulator, kopf running in-process."""
from __future__ import annotations

import pytest

from tests.operator.conftest import (AIS, DEPLOYMENTS, NS, PDBS, SCALED_OBJECTS, SERVICES, eventually,
                                     inference_service, live, running_operator)



async def test_create_builds_owned_objects_and_status_follows_the_deployment(cluster):
    async with running_operator():
        await cluster.post(f"/apis/argosy.dev/v1alpha1/namespaces/{NS}/inferenceservices",
                           json=inference_service(autoscaling={"maxReplicas": 4,
                                                               "prometheusAddress": "http://prom:9090"}))
        uid = live(cluster, AIS, "llama")["metadata"]["uid"]
        for resource in (DEPLOYMENTS, SERVICES, PDBS, SCALED_OBJECTS):
            obj = await eventually(lambda r=resource: live(cluster, r, "llama"))
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        status = await eventually(lambda: live(cluster, AIS, "llama").get("status"))
        assert status["conditions"][0]["type"] == "Ready" and status["conditions"][0]["status"] == "False"
