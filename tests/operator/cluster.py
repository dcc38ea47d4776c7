"""The operator against the Kubernetes API emulator, with kopf running in the test's loop:
the resources it serves, the operator's own run, and reading and writing objects."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any

import kmock
import kopf

from argosy.operator import status
from argosy.operator.kinds import OWNED_KINDS
from tests.operator.crd_schema import load_crd
from tests.operator.emulator import ClusterEmulator
from tests.polling import eventually

CRD = load_crd()
CACHE_CRD = load_crd("modelcaches.argosy.dev")
AIS = kmock.resource("argosy.dev", "v1alpha1", "inferenceservices")
MODEL_CACHES = kmock.resource("argosy.dev", "v1alpha1", "modelcaches")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
CONFIG_MAPS = kmock.resource("", "v1", "configmaps")
PDBS = kmock.resource("policy", "v1", "poddisruptionbudgets")
SCALED_OBJECTS = kmock.resource("keda.sh", "v1alpha1", "scaledobjects")
INFERENCE_POOLS = kmock.resource("inference.networking.k8s.io", "v1", "inferencepools")
HTTP_ROUTES = kmock.resource("gateway.networking.k8s.io", "v1", "httproutes")
SERVICE_ACCOUNTS = kmock.resource("", "v1", "serviceaccounts")
ROLES = kmock.resource("rbac.authorization.k8s.io", "v1", "roles")
ROLE_BINDINGS = kmock.resource("rbac.authorization.k8s.io", "v1", "rolebindings")
LEADER_WORKER_SETS = kmock.resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
# Each add-on's kinds: (resource, kind, singular).
ADD_ONS = {
    "keda": [(SCALED_OBJECTS, "ScaledObject", "scaledobject")],
    "inference-extension": [(INFERENCE_POOLS, "InferencePool", "inferencepool")],
    "gateway-api": [(HTTP_ROUTES, "HTTPRoute", "httproute")],
    "lws": [(LEADER_WORKER_SETS, "LeaderWorkerSet", "leaderworkerset")],
}
NS = "llm"
_current: dict[str, Any] = {}  # this test's emulator and its URL


def point_kopf_at(emulator: ClusterEmulator, url: str) -> None:
    _current.update(emulator=emulator, url=url)


@kopf.on.login()
def login_to_the_emulator(**_: Any) -> kopf.ConnectionInfo:
    """kopf reads $KUBECONFIG once, at import; the tests point it at each test's emulator."""
    return kopf.ConnectionInfo(server=_current["url"], insecure=True, token="test-token")


def declare_resources(emulator: ClusterEmulator, *add_ons: str) -> None:
    """The built-in kinds, Argosy's kinds, and the kinds of the add-ons named."""
    emulator.resources.load_bundled()
    for resource in [r for r in emulator.resources if r.group == "gateway.networking.k8s.io"]:
        del emulator.resources[resource]  # bundled with the emulator, yet an add-on of real clusters
    for resource, crd, subresources in ((AIS, CRD, {"status", "scale"}), (MODEL_CACHES, CACHE_CRD, {"status"})):
        names = crd["spec"]["names"]
        emulator.resources[resource] = kmock.ResourceInfo(
            namespaced=True,
            kind=names["kind"],
            singular=names["singular"],
            shortnames=set(names["shortNames"]),
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources=subresources,
        )
    for resource, kind, singular in (kind for add_on in add_ons for kind in ADD_ONS[add_on]):
        emulator.resources[resource] = kmock.ResourceInfo(
            namespaced=True,
            kind=kind,
            singular=singular,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources={"status"},
        )


@contextlib.asynccontextmanager
async def running_operator(namespaces=(NS,)):
    """kopf running the operator's handlers, its watches connected."""
    import argosy.operator.handlers  # noqa: F401  (registers the handlers)

    emulator = _current["emulator"]
    since = len(list(emulator))
    served = {resource.plural for resource in emulator.resources}
    watching = {"inferenceservices", "modelcaches"} | ({kind.plural for kind in OWNED_KINDS} & served)

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.level = 30
    stop = asyncio.Event()
    ready = asyncio.Event()
    before = asyncio.all_tasks()
    task = asyncio.create_task(
        kopf.operator(standalone=True, namespaces=list(namespaces), settings=settings, stop_flag=stop, ready_flag=ready)
    )
    await asyncio.wait_for(ready.wait(), 10)
    await eventually(lambda: watched(emulator, since) >= watching, what="the operator's watches to connect")
    try:
        yield
    finally:
        stop.set()
        await _stopped(task, before)


async def _stopped(operator: asyncio.Task, before: set[asyncio.Task]) -> None:
    """Waits for kopf's graceful exit. kopf takes every task made after it started for its own
    and gives them 5 s to end: the emulator's keep-alive connections, served in this loop, never
    would. Once nothing else of kopf's is left, they are closed (as a server shutting down
    closes its idle connections) and kopf exits at once."""
    deadline = asyncio.get_running_loop().time() + 30
    while not operator.done():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("the operator did not stop within 30 s")
        left = asyncio.all_tasks() - before - {operator, asyncio.current_task()}
        if left and all(_serves_a_connection(t) for t in left):
            for connection in left:
                connection.cancel()
        await asyncio.sleep(0.02)
    await operator


def _serves_a_connection(task: asyncio.Task) -> bool:
    return getattr(task.get_coro(), "__qualname__", "") == "RequestHandler.start"


def watched(emulator: ClusterEmulator, since: int = 0) -> set[str]:
    """The plurals of the resources watched after request number `since`."""
    return {
        r.resource.plural
        for r in list(emulator)[since:]
        if r.resource is not None and r.params.get("watch") in ("true", "1")
    }


def from_operator(request) -> bool:
    """Not one of the test's own calls (those go through kmock's client)."""
    return not request.headers.get("User-Agent", "").startswith("kmock")


def verb(request) -> str:
    method = request.method.value
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


def calls_made(cluster) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every request but the test's own, as RBAC names them."""
    calls = set()
    for request in cluster:
        if request.resource is None or request.resource.plural is None or not from_operator(request):
            continue  # discovery, and the test's own calls
        plural = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        calls.add((request.resource.group, plural, verb(request)))
    return calls


def reconciles_since(emulator: ClusterEmulator, since: int) -> int:
    """Reconciles that started after request number `since` and have applied every object:
    each begins by reading its InferenceService and ends by listing its pods."""
    started = done = 0
    for r in list(emulator)[since:]:
        if r.resource is None or r.method.value != "GET" or r.params.get("watch") or not from_operator(r):
            continue
        if r.resource.plural == "inferenceservices" and r.name:
            started += 1
        elif r.resource.plural == "pods" and not r.name and started > done:
            done += 1
    return done


async def no_reconcile_running(name: str, namespace: str = NS) -> None:
    """Returns once no reconcile of the service is in progress (their threads outlive kopf)."""
    from argosy.operator.handlers import RECONCILES

    await eventually(lambda: RECONCILES.idle(("inferenceservices", namespace, name)), what=f"{name}'s reconciles")


def live(emulator: ClusterEmulator, resource, name: str, namespace: str = NS) -> dict[str, Any] | None:
    key = (resource, namespace, name)
    if key not in emulator.objects or emulator.objects[key].deleted:
        return None
    return copy.deepcopy(emulator.objects[key].raw)


def inference_service(name: str = "llama", **spec: Any) -> dict[str, Any]:
    base = {
        "model": {
            "name": "llama-3-8b",
            "path": "llama-3-8b-instruct",
            "hostPath": "/mnt/nvme/models",
            "nodeSelector": {"argosy.dev/model-llama-3-8b": "true"},
        },
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    base.update(spec)
    return {
        "apiVersion": "argosy.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": base,
    }


def path(resource, name: str | None = None, namespace: str = NS, subresource: str | None = None) -> str:
    base = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    result = f"{base}/namespaces/{namespace}/{resource.plural}"
    return result + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


async def mark_deployment_ready(emulator: ClusterEmulator, name: str, ready: int, resource=DEPLOYMENTS) -> None:
    """Plays the Deployment controller (or LeaderWorkerSet's, whose status has the same fields, its
    replicas the groups): the rollout of the current generation has `ready` pods."""
    deployment = live(emulator, resource, name)
    replicas = deployment["spec"].get("replicas", 1)
    status = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    await patch(emulator, resource, name, {"status": status}, subresource="status")


async def patch(
    emulator: ClusterEmulator, resource, name: str, body: dict[str, Any], subresource: str | None = None
) -> None:
    """A JSON merge patch, as `kubectl patch --type merge` sends it; it must succeed."""
    response = await emulator.patch(
        path(resource, name, subresource=subresource),
        json=body,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()


def ready_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    return status.ready_condition(obj.get("status") or {})


def writes(emulator: ClusterEmulator, since: int = 0) -> list:
    """Create/patch/put/delete requests the emulator saw after request number `since`."""
    return [
        r
        for r in list(emulator)[since:]
        if r.method.value in ("POST", "PATCH", "PUT", "DELETE")
        and r.resource is not None
        and r.resource.plural != "events"
    ]
