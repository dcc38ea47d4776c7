"""The operator against the Kubernetes API emulator, with kopf running in the test's loop."""
from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from typing import Any

import kmock
import kopf
import pytest
import yaml

from argosy.operator import status
from tests.operator.crd_schema import load_crd
from tests.operator.emulator import ClusterEmulator

CRD = load_crd()
AIS = kmock.resource("argosy.dev", "v1alpha1", "inferenceservices")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
PDBS = kmock.resource("policy", "v1", "poddisruptionbudgets")
SCALED_OBJECTS = kmock.resource("keda.sh", "v1alpha1", "scaledobjects")
NS = "llm"
_emulator_url: dict[str, str] = {}


@kopf.on.login()
def login_to_the_emulator(**_: Any) -> kopf.ConnectionInfo:
    """kopf reads $KUBECONFIG once, at import; the tests point it at each test's emulator."""
    return kopf.ConnectionInfo(server=_emulator_url["url"], insecure=True, token="test-token")


def declare_resources(emulator: ClusterEmulator, keda: bool) -> None:
    emulator.resources.load_bundled()
    names = CRD["spec"]["names"]
    emulator.resources[AIS] = kmock.ResourceInfo(
        namespaced=True, kind=names["kind"], singular=names["singular"], shortnames=set(names["shortNames"]),
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"}, subresources={"status", "scale"})
    if keda:
        emulator.resources[SCALED_OBJECTS] = kmock.ResourceInfo(
            namespaced=True, kind="ScaledObject", singular="scaledobject",
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"}, subresources={"status"})


@pytest.fixture
async def cluster(tmp_path, monkeypatch):
    """An emulated API server with the CRD (and KEDA's) served, and a kubeconfig pointing at it."""
    async with ClusterEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.failures = {}
        declare_resources(emulator, keda=True)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": str(server.url).rstrip("/")}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}]}))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        _emulator_url["url"] = str(server.url).rstrip("/")
        yield emulator


@contextlib.asynccontextmanager
async def running_operator(namespaces=(NS,)):
    import argosy.operator.handlers  # noqa: F401  (registers the handlers)

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.level = 30
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(kopf.operator(standalone=True, namespaces=list(namespaces), settings=settings,
                                             stop_flag=stop, ready_flag=ready))
    await asyncio.wait_for(ready.wait(), 10)
    await asyncio.sleep(1.0)  # let the watchers connect before the test acts
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def eventually(check, timeout: float = 15.0, interval: float = 0.1):
    """Polls `check` until it returns a truthy value (returned) or raises no AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result is not None and result is not False:
                return result
        except (AssertionError, KeyError, TypeError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(interval)


def live(emulator: ClusterEmulator, resource, name: str, namespace: str = NS) -> dict[str, Any] | None:
    key = (resource, namespace, name)
    if key not in emulator.objects or emulator.objects[key].deleted:
        return None
    return copy.deepcopy(emulator.objects[key].raw)


def inference_service(name: str = "llama", **spec: Any) -> dict[str, Any]:
    base = {"model": {"name": "llama-3-8b", "path": "llama-3-8b-instruct", "hostPath": "/mnt/nvme/models",
                      "nodeSelector": {"argosy.dev/model-llama-3-8b": "true"}},
            "resources": {"limits": {"nvidia.com/gpu": 1}}}
    base.update(spec)
    return {"apiVersion": "argosy.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": NS}, "spec": base}


def path(resource, name: str | None = None, namespace: str = NS, subresource: str | None = None) -> str:
    base = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    result = f"{base}/namespaces/{namespace}/{resource.plural}"
    return result + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


async def mark_deployment_ready(emulator: ClusterEmulator, name: str, ready: int) -> None:
    """Plays the Deployment controller: the rollout of the current generation has `ready` pods."""
    deployment = live(emulator, DEPLOYMENTS, name)
    replicas = deployment["spec"].get("replicas", 1)
    status = {"observedGeneration": deployment["metadata"]["generation"], "replicas": replicas,
              "updatedReplicas": replicas, "readyReplicas": ready, "availableReplicas": ready}
    await patch(emulator, DEPLOYMENTS, name, {"status": status}, subresource="status")


async def patch(emulator: ClusterEmulator, resource, name: str, body: dict[str, Any],
                subresource: str | None = None) -> None:
    """A JSON merge patch, as `kubectl patch --type merge` sends it; it must succeed."""
    response = await emulator.patch(path(resource, name, subresource=subresource), json=body,
                                    headers={"Content-Type": "application/merge-patch+json"})
    assert response.status == 200, await response.text()


def ready_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    return status.ready_condition(obj.get("status") or {})


def writes(emulator: ClusterEmulator, since: int = 0) -> list:
    """Create/patch/put/delete requests the emulator saw after request number `since`."""
    return [r for r in list(emulator)[since:] if r.method.value in ("POST", "PATCH", "PUT", "DELETE")
            and r.resource is not None and r.resource.plural != "events"]
