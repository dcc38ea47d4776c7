"""The operator's side of the model cache: an InferenceService with spec.model.cacheRef runs
only on nodes holding a ready copy, mounted read-only; a ModelCache's counts and conditions
from its nodes and the agents' entries; what a service reports of its cache; and the whole
loop against the emulated API server (agent, operator, service)."""

from __future__ import annotations

from argosy.operator.deployment import build_deployment
from argosy.operator.model_cache.spec import ModelCacheSpec
from argosy.operator.model_cache.status import cache_status, service_cache
from argosy.operator.owner import Owner
from argosy.operator.spec import InferenceServiceSpec
from tests.operator.cluster import AIS, DEPLOYMENTS, NS, inference_service, live, path, running_operator
from tests.operator.model_cache.harness import MODEL_CACHES, agent_for, cache_path, files_of, model_cache, passes_until
from tests.operator.specs import SPECS
from tests.polling import eventually

OWNER = Owner(name="llama", namespace="llm", uid="u1", generation=2)
READY_TERM = {"key": "modelcache.argosy.dev/llm.llama-3-8b", "operator": "In", "values": ["ready"]}


def test_the_pods_need_a_node_with_a_ready_copy_and_mount_it_read_only():
    spec = InferenceServiceSpec.model_validate(SPECS["model-cache"])
    pod = build_deployment(OWNER, spec, "/mnt/nvme/argosy")["spec"]["template"]["spec"]
    [model] = [v for v in pod["volumes"] if v["name"] == "model"]
    assert model == {"name": "model", "hostPath": {"path": "/mnt/nvme/argosy/llm/llama-3-8b", "type": "Directory"}}
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model"]
    assert mount["readOnly"] and "/models/." in pod["containers"][0]["args"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1] for t in terms] == [READY_TERM, READY_TERM]  # each alternative needs it
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["h100"], ["h200"]]
    bare = InferenceServiceSpec.model_validate({"model": {"name": "m", "cacheRef": {"name": "llama-3-8b"}}})
    affinity = build_deployment(OWNER, bare)["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [READY_TERM]}
    ]


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


SPEC = ModelCacheSpec.model_validate(
    {"source": {"http": {"url": "https://store/llama"}}, "manifestPath": "m.json", "nodeSelector": {"gpu": "h100"}}
)
NODES = [node("a", gpu="h100"), node("b", gpu="h100"), node("c", gpu="a100")]


def reason(status: dict) -> tuple[str, str, str]:
    ready, _, stalled = status["conditions"]
    return ready["status"], ready["reason"], stalled["status"]


def test_a_caches_status_counts_its_nodes_and_says_what_holds_it_back():
    copying = {"phase": "Copying", "bytesDone": 25, "bytesTotal": 100}
    status = cache_status(SPEC, 3, NODES, {"a": {"phase": "Ready"}, "b": copying}, [], "now")
    assert (status["desiredNodes"], status["readyNodes"], status["observedGeneration"]) == (2, 1, 3)
    assert reason(status) == ("False", "Copying", "False")
    assert "ready on 1/2 nodes; b Copying 25%" in status["conditions"][0]["message"]
    done = cache_status(SPEC, 3, NODES, {"a": {"phase": "Ready"}, "b": {"phase": "Ready"}, "gone": {}}, [], "now")
    assert reason(done) == ("True", "AllNodesReady", "False") and done["nodes"] == {"gone": None}
    failing = {"phase": "Failed", "attempts": 3, "reason": "ChecksumMismatch", "message": "config.json: SHA-256 x"}
    stuck = cache_status(SPEC, 3, NODES, {"a": {"phase": "Ready"}, "b": failing}, [], "now")
    assert (
        reason(stuck) == ("False", "ChecksumMismatch", "True") and "b: config.json" in stuck["conditions"][0]["message"]
    )
    retrying = cache_status(SPEC, 3, NODES, {"b": {**failing, "attempts": 1}}, [], "now")
    assert reason(retrying) == ("False", "Copying", "False")
    full = {"phase": "Pending", "reason": "QuotaExceeded", "message": "needs 16.00 GB"}
    assert reason(cache_status(SPEC, 3, NODES, {"a": full}, [], "now")) == ("False", "QuotaExceeded", "True")
    nowhere = SPEC.model_copy(update={"nodeSelector": {"gpu": "tpu"}})
    assert reason(cache_status(nowhere, 3, NODES, {}, [], "now")) == ("False", "NoNodesSelected", "True")


def test_a_service_reports_its_caches_ready_nodes_and_why_its_pods_wait():
    report, problem = service_cache("llama", None, None)
    assert problem.reason == "ModelCacheNotFound" and problem.stalled
    waiting = {"status": {"readyNodes": 0, "desiredNodes": 2, "conditions": [{"type": "Ready", "message": "b 40%"}]}}
    report, problem = service_cache("llama", waiting, 4)
    assert problem.reason == "ModelCacheNotReady" and not problem.stalled and "b 40%" in problem.message
    assert report["readyNodes"] == 0 and "maxReplicas (4)" in report["message"]
    report, problem = service_cache("llama", {"status": {"readyNodes": 2, "desiredNodes": 2}}, 2)
    assert problem is None and report == {"name": "llama", "readyNodes": 2, "desiredNodes": 2}


async def test_agent_operator_and_service_together(caches, store, source, tmp_path):
    async with running_operator():
        await caches.post(path(AIS), json=inference_service(model={"name": "llama", "cacheRef": {"name": "llama"}}))
        waiting = await eventually(lambda: live(caches, AIS, "llama")["status"]["conditions"][0])
        assert waiting["reason"] == "ModelCacheNotFound"
        await caches.post(cache_path(), json=model_cache("llama", source.url, files_of(store)))
        await eventually(lambda: live(caches, MODEL_CACHES, "llama")["status"]["desiredNodes"] == 2)
        await eventually(
            lambda: live(caches, AIS, "llama")["status"]["conditions"][0]["reason"] == "ModelCacheNotReady"
        )
        agent = agent_for(tmp_path / "node-a")
        await passes_until(agent, lambda: live(caches, MODEL_CACHES, "llama")["status"]["readyNodes"] == 1, "a copy")
        status = await eventually(
            lambda: (
                live(caches, AIS, "llama")["status"]["modelCache"]["readyNodes"] == 1
                and live(caches, AIS, "llama")["status"]
            )
        )
        assert status["modelCache"]["desiredNodes"] == 2
        assert status["conditions"][0]["reason"] != "ModelCacheNotReady"
        pod = live(caches, DEPLOYMENTS, "llama")["spec"]["template"]["spec"]
        assert pod["volumes"][0]["hostPath"]["path"].endswith(f"/{NS}/llama")
