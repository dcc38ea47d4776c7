"""The CRD admits good InferenceServices and rejects bad ones, schema and CEL rules alike,
with a message naming the field; its defaults are the operator's."""

from __future__ import annotations

import copy

import pytest

from argosy.operator import crd
from tests.operator.crd_schema import admit, load_crd, openapi_schema
from tests.operator.specs import ADAPTERS, AUTOSCALING, MODEL, ROUTING, SPECS

CRD = load_crd()
ROUTE = {"gateway": {"name": "inference-gateway"}}


def resource(spec: dict) -> dict:
    return {
        "apiVersion": "argosy.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "svc", "namespace": "llm"},
        "spec": spec,
    }


def with_(path: str, value) -> dict:
    """A good spec with one field set (value None removes it)."""
    spec = copy.deepcopy({"model": MODEL, "autoscaling": AUTOSCALING})
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return spec


@pytest.mark.parametrize("name", sorted(SPECS))
def test_good_specs_are_admitted(name):
    assert admit(resource(SPECS[name]))[1] == []


BAD = [
    # (spec, words the rejection must contain)
    (with_("model.name", None), ["model", "name"]),
    (with_("model.name", "has space"), ["spec.model.name", "does not match"]),
    (with_("model.path", "/etc/passwd"), ["spec.model.path"]),
    (with_("model.path", "models/../../etc"), ["spec.model.path"]),
    (with_("model.hostPath", "relative/dir"), ["spec.model.hostPath"]),
    (with_("model.persistentVolumeClaim", {"claimName": "models"}), ["spec.model", "exactly one"]),
    (with_("model.hostPath", None), ["spec.model", "exactly one"]),
    (with_("engine.maxNumSeqs", 0), ["spec.engine.maxNumSeqs", "minimum"]),
    (with_("engine.blockSize", 12), ["spec.engine.blockSize", "is not one of"]),
    (with_("engine.gpuMemoryUtilization", 1.5), ["spec.engine.gpuMemoryUtilization", "maximum"]),
    (with_("engine.dtype", "int8"), ["spec.engine.dtype"]),
    (with_("engine.maxModelLen", 8), ["spec.engine.maxModelLen"]),
    (
        with_("engine", {"enableChunkedPrefill": False, "maxModelLen": 8192, "maxNumBatchedTokens": 2048}),
        ["spec.engine.maxNumBatchedTokens", "maxModelLen"],
    ),
    (with_("engine.shutdownTimeoutSeconds", -1), ["spec.engine.shutdownTimeoutSeconds"]),
    (with_("engine.engineStepTimeoutSeconds", 0), ["spec.engine.engineStepTimeoutSeconds", "minimum"]),
    (with_("engine.apiKeySecretRef", {"name": "keys"}), ["spec.engine.apiKeySecretRef", "key"]),
    (with_("engine.extraFlag", True), ["spec.engine", "extraFlag"]),
    (with_("replicas", -1), ["spec.replicas", "minimum"]),
    (with_("autoscaling.minReplicas", 9), ["spec.autoscaling.minReplicas", "maxReplicas"]),
    (with_("autoscaling.maxReplicas", None), ["spec.autoscaling", "maxReplicas"]),
    (with_("autoscaling.maxReplicas", 0), ["spec.autoscaling.maxReplicas", "minimum"]),
    (with_("autoscaling.targetWaitingRequests", 0), ["spec.autoscaling.targetWaitingRequests"]),
    (with_("autoscaling.prometheusAddress", "prometheus:9090"), ["spec.autoscaling.prometheusAddress"]),
    (with_("autoscaling.scaleDownStabilizationSeconds", 7200), ["spec.autoscaling.scaleDownStabilizationSeconds"]),
    (with_("imagePullPolicy", "Sometimes"), ["spec.imagePullPolicy"]),
    (with_("resources", {"limits": {"nvidia.com/gpu": "one"}}), ["spec.resources.limits.nvidia.com/gpu"]),
    (with_("tolerations", [{"operator": "Maybe"}]), ["spec.tolerations.0.operator"]),
    (with_("startupTimeoutSeconds", 5), ["spec.startupTimeoutSeconds"]),
    (with_("shmSize", "lots"), ["spec.shmSize"]),
    (with_("modle", {}), ["spec", "modle"]),
    (with_("autoscaling.minReplicas", 0), ["spec.autoscaling.minReplicas", "only with spec.routing"]),
    (with_("autoscaling.minReplicas", -1), ["spec.autoscaling.minReplicas", "minimum"]),
    (with_("routing", {}), ["spec.routing", "exactly one of endpointPicker and router"]),
    (
        with_("routing", {**ROUTING, "router": {}}),
        ["spec.routing", "exactly one of endpointPicker and router"],
    ),
    (with_("routing", {"router": {}, "route": ROUTE}), ["spec.routing.route", "needs spec.routing.endpointPicker"]),
    (with_("routing", {"router": {"policy": "random"}}), ["spec.routing.router.policy"]),
    (with_("routing", {"router": {"replicas": 0}}), ["spec.routing.router.replicas"]),
    (
        with_("autoscaling", {**AUTOSCALING, "minReplicas": 0}) | {"routing": {"router": {}}},
        ["spec.autoscaling.minReplicas", "only with spec.routing.endpointPicker"],
    ),
    (with_("engine.kvEventsConfig", {"port": 80}), ["spec.engine.kvEventsConfig.port"]),
    (with_("engine.kvEventsConfig", {"connect": "tcp://*:5557"}), ["spec.engine.kvEventsConfig.connect"]),
    (with_("engine.prefixCachingHashAlgo", "sha256_cbor"), ["spec.engine.hashSeed", "sha256_cbor"]),
    (with_("engine.prefixCachingHashAlgo", "xxhash"), ["spec.engine.prefixCachingHashAlgo"]),
    (with_("engine.kvEventsConfig", {"bufferSteps": 0}), ["spec.engine.kvEventsConfig.bufferSteps"]),
    (with_("routing", {"endpointPicker": {"port": 9002}}), ["spec.routing.endpointPicker", "name", "required"]),
    (with_("routing", {"endpointPicker": {"name": ""}}), ["spec.routing.endpointPicker.name"]),
    (with_("routing", {**ROUTING, "route": {}}), ["spec.routing.route", "gateway", "required"]),
    (with_("routing", {**ROUTING, "route": {"gateway": {}}}), ["spec.routing.route.gateway", "name", "required"]),
    (with_("routing.endpointPicker", {"name": "epp", "port": 0}), ["spec.routing.endpointPicker.port"]),
    (with_("routing.endpointPicker", {"name": "epp", "failureMode": "Retry"}), ["spec.routing.endpointPicker"]),
    (with_("routing", {**ROUTING, "route": {**ROUTE, "pathPrefix": "v1"}}), ["spec.routing.route.pathPrefix"]),
    (with_("routing", {**ROUTING, "route": {**ROUTE, "pathPrefix": "/a b"}}), ["spec.routing.route.pathPrefix"]),
    (
        with_("routing", {**ROUTING, "route": {**ROUTE, "pathPrefix": "/v1//chat"}}),
        ["spec.routing.route.pathPrefix", "normalized"],
    ),
    (with_("routing", {**ROUTING, "route": {**ROUTE, "hostnames": ["LLM_host"]}}), ["spec.routing.route.hostnames"]),
    (
        with_("routing", {**ROUTING, "route": {"gateway": {"name": "gw", "namespace": "Gateways"}}}),
        ["spec.routing.route.gateway.namespace"],
    ),
    (
        with_("routing", {**ROUTING, "route": {"gateway": {"name": "gw", "sectionName": "HTTPS"}}}),
        ["spec.routing.route.gateway.sectionName"],
    ),
    (with_("disruptionBudget", {"maxUnavailable": -1}), ["spec.disruptionBudget.maxUnavailable"]),
    (with_("disruptionBudget", {"maxUnavailable": "1"}), ["spec.disruptionBudget.maxUnavailable"]),
    (with_("rollout", {"maxSurge": 0, "maxUnavailable": "0%"}), ["spec.rollout", "both be zero"]),
    (with_("adapters", [*ADAPTERS, ADAPTERS[0]]), ["spec.adapters", "unique"]),
    (with_("adapters", [{"name": MODEL["name"], "path": "a"}]), ["spec.adapters", "differ from spec.model.name"]),
    (with_("adapters", [{"name": "bad name", "path": "a"}]), ["spec.adapters.0.name"]),
    (with_("adapters", [{"name": "a", "path": "/abs"}]), ["spec.adapters[].path", "relative"]),
    (with_("adapters", [{"name": "a", "path": "../up"}]), ["spec.adapters[].path", "'..'"]),
    (with_("adapters", [{"name": "a"}]), ["spec.adapters.0", "path", "required"]),
    (with_("lora", {"maxLoras": 4, "maxCpuLoras": 2}), ["spec.lora.maxCpuLoras", "at least"]),
    (with_("lora", {"maxLoraRank": 0}), ["spec.lora.maxLoraRank", "minimum"]),
    (with_("engine.speculativeConfig", {"method": "draft_model", "numSpeculativeTokens": 4}), [
        "spec.engine.speculativeConfig.model", "draft_model"]),
    (with_("engine.speculativeConfig", {"method": "ngram", "numSpeculativeTokens": 4, "model": "d"}), [
        "spec.engine.speculativeConfig.model", "only with it"]),
    (with_("engine.speculativeConfig", {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 5,
                                        "promptLookupMax": 2}), ["spec.engine.speculativeConfig.promptLookupMin"]),
    (with_("engine.speculativeConfig", {"method": "medusa", "numSpeculativeTokens": 4}), [
        "spec.engine.speculativeConfig.method"]),
    (with_("engine.speculativeConfig", {"method": "ngram", "numSpeculativeTokens": 0}), [
        "spec.engine.speculativeConfig.numSpeculativeTokens", "minimum"]),
    (with_("engine.speculativeConfig", {"method": "draft_model", "numSpeculativeTokens": 4, "model": "../d"}), [
        "spec.engine.speculativeConfig.model", "'..'"]),
    (with_("engine.schedulingPolicy", "lifo"), ["spec.engine.schedulingPolicy"]),
    (with_("engine.tensorParallelSize", 0), ["spec.engine.tensorParallelSize", "minimum"]),
    ({"model": MODEL, "engine": {"tensorParallelSize": 2}, "resources": {"limits": {"nvidia.com/gpu": 1}}}, [
        "nvidia.com/gpu", "must equal spec.engine.tensorParallelSize"]),
    (with_("engine.swapSpace", -1), ["spec.engine.swapSpace", "minimum"]),
    (with_("engine", {"swapSpace": 4, "enablePrefixCaching": False}), [
        "spec.engine.swapSpace", "enablePrefixCaching"]),
    (with_("engine", {"swapSpace": 4, "speculativeConfig": {"method": "draft_model", "numSpeculativeTokens": 4,
                                                            "model": "d"}}), ["spec.engine.swapSpace", "draft model"]),
    (with_("engine", {"swapSpace": 4, "kvTransferConfig": {}}), ["spec.engine.kvTransferConfig", "give one"]),
    ({"model": MODEL, "engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2},
      "resources": {"limits": {"nvidia.com/gpu": 3}}}, ["nvidia.com/gpu", "x pipelineParallelSize"]),
    ({"model": MODEL, "routing": {"router": {}}, "disaggregation": {}, "engine": {"pipelineParallelSize": 2}}, [
        "spec.disaggregation", "pipelineParallelSize must be 1"]),
    ({"model": MODEL, "engine": {"pipelineParallelSize": 2}, "adapters": ADAPTERS}, [
        "spec.lora and spec.adapters are not served with spec.engine.pipelineParallelSize"]),
    (with_("engine", {"pipelineParallelSize": 2, "speculativeConfig": {"method": "ngram", "numSpeculativeTokens": 4}}),
     ["spec.engine.speculativeConfig is not served with spec.engine.pipelineParallelSize"]),
    (with_("engine", {"pipelineParallelSize": 2, "kvTransferConfig": {}}), [
        "spec.engine.kvTransferConfig is not served with spec.engine.pipelineParallelSize"]),
    (with_("engine", {"pipelineParallelSize": 2, "swapSpace": 4}), [
        "spec.engine.swapSpace is not served with spec.engine.pipelineParallelSize"]),
    (with_("engine.pipelineParallelSize", 0), ["spec.engine.pipelineParallelSize", "minimum"]),
    ({"model": MODEL, "disaggregation": {}}, ["spec.disaggregation", "needs spec.routing.router"]),
    (with_("disaggregation", {}) | {"routing": {"router": {}}}, ["spec.autoscaling", "autoscale each role"]),
    ({"model": MODEL, "routing": {"router": {}}, "disaggregation": {}, "engine": {"tensorParallelSize": 2}}, [
        "spec.disaggregation", "tensorParallelSize must be 1"]),
    ({"model": MODEL, "routing": {"router": {}}, "disaggregation": {"decode": {"replicas": -1}}}, [
        "spec.disaggregation.decode.replicas", "minimum"]),
    ({"model": MODEL, "routing": {"router": {}}, "disaggregation": {"kvTransferConfig": {"holdTimeoutSeconds": 0}}}, [
        "spec.disaggregation.kvTransferConfig.holdTimeoutSeconds"]),
    *(({"model": MODEL, "routing": {"router": {}}, "disaggregation": {role: {"autoscaling": {
        "maxReplicas": 2, "prometheusAddress": "http://p", "objectives": {
            "timeToFirstTokenSeconds": 1, "interTokenLatencySeconds": 0.1, "profileConfigMap": "p"}}}}}, [
        f"spec.disaggregation.{role}.autoscaling.objectives", "not supported yet"]) for role in ("prefill", "decode")),
]  # fmt: skip


@pytest.mark.parametrize("name", ["8b-chat", "llama-3.1-8b", "Llama", "a" * 47, "ends-"])
def test_names_that_owned_objects_cannot_carry_are_rejected(name):
    body = resource({"model": MODEL})
    body["metadata"]["name"] = name
    errors = admit(body)[1]
    assert any("metadata.name" in e and "DNS-1035" in e for e in errors), errors


@pytest.mark.parametrize("spec, words", BAD, ids=[" ".join(w) for _, w in BAD])
def test_bad_specs_are_rejected_naming_the_field(spec, words):
    errors = admit(resource(spec))[1]
    assert errors, "admitted"
    assert any(all(w in e for w in words) for e in errors), errors


def test_every_cel_rule_has_a_failing_case():
    rules = []

    def collect(schema):
        rules.extend(r["message"] for r in schema.get("x-kubernetes-validations", []))
        for sub in [*(schema.get("properties") or {}).values(), *([schema["items"]] if "items" in schema else [])]:
            collect(sub)

    collect(openapi_schema(CRD))
    # (each role of spec.disaggregation has its own autoscaling rule and its objectives' refusal; pipeline
    # parallelism refuses LoRA, speculation, KV connectors, the host tier and disaggregation: 35). Tensor
    # parallelism serves LoRA and draft models: no rule refuses them.
    assert len(rules) == 35
    bad_name = resource({"model": MODEL})
    bad_name["metadata"]["name"] = "8b"
    long_name = resource({"model": MODEL, "routing": {"router": {}}, "disaggregation": {}})
    long_name["metadata"]["name"] = "a" * 39  # its roles' Deployments would be too long to name their pods
    rejections = [e for spec, _ in BAD for e in admit(resource(spec))[1]] + admit(bad_name)[1] + admit(long_name)[1]
    for message in rules:
        assert any(message in e for e in rejections), message


def test_crd_shape():
    version = CRD["spec"]["versions"][0]
    assert CRD["spec"]["group"] == "argosy.dev" and version["name"] == "v1alpha1"
    assert CRD["spec"]["names"]["shortNames"] == ["ais"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.name" and columns["URL"] == ".status.url"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert "Age" in columns and "Replicas" in columns


def undescribed(schema, path: str) -> list[str]:
    """Fields without a description, which `kubectl explain` would show bare."""
    missing = [] if schema.get("description") else [path]
    for name, sub in (schema.get("properties") or {}).items():
        missing += undescribed(sub, f"{path}.{name}")
    if "items" in schema:
        missing += undescribed(schema["items"], f"{path}[]")
    return missing


def test_every_field_is_described_for_kubectl_explain():
    schema = openapi_schema(CRD)
    assert (
        undescribed(schema["properties"]["spec"], "spec") + undescribed(schema["properties"]["status"], "status") == []
    )


def test_the_committed_crds_are_what_the_models_generate():
    assert crd.main(["--check"]) == 0
    for resource in crd.RESOURCES:
        for path in crd.targets(resource):
            assert path.read_text() == crd.render(resource)


def test_a_stale_crd_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(crd, "ROOT", tmp_path)
    for each in crd.RESOURCES:
        for path in crd.targets(each):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(crd.render(each))
    resource = crd.RESOURCES[0]
    stale, _ = crd.targets(resource)
    stale.write_text(crd.render(resource).replace("minimum: 16", "minimum: 8"))
    assert crd.main(["--check"]) == 1 and f"{stale.name} is out of date" in capsys.readouterr().err
    assert crd.main([]) == 0 and crd.main(["--check"]) == 0 and stale.read_text() == crd.render(resource)
