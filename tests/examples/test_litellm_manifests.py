"""The LiteLLM example's Kubernetes manifests: they build with kustomize into objects valid
for Kubernetes and the CRD, and they agree with each other and with config.yaml (the proxy
reaches each InferenceService at the URL the operator gives it, under its served name)."""

from __future__ import annotations

import re

import kubernetes_validate
import yaml

from argosy.operator.labels import service_url
from argosy.operator.owner import Owner
from tests.examples.test_gitops import ROOT, kustomize
from tests.operator.crd_schema import admit

FOLDER = ROOT / "examples" / "litellm"


def built() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in kustomize(FOLDER)}


def test_the_manifests_are_valid_and_the_services_admitted():
    objects = built()
    services = [o for (kind, _), o in objects.items() if kind == "InferenceService"]
    assert len(services) == 2
    for service in services:
        assert admit(service)[1] == []
    for (kind, _), obj in objects.items():
        if kind != "InferenceService":
            kubernetes_validate.validate(obj, "1.32", strict=True)


def test_the_proxy_reaches_each_service_under_its_served_name():
    objects = built()
    config_maps = [o for (kind, _), o in objects.items() if kind == "ConfigMap"]
    (config_map,) = config_maps
    assert config_map["data"]["config.yaml"] == (FOLDER / "config.yaml").read_text()
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    pod = objects["Deployment", "litellm"]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]  # the generated name
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    referenced = set(re.findall(r"'os\.environ/(\w+)'", repr(config)))  # every value read from the environment
    assert referenced and referenced <= set(env)

    urls = {}
    for (kind, name), obj in objects.items():
        if kind == "InferenceService":
            owner = Owner(name=name, namespace=obj["metadata"]["namespace"], uid="u")
            urls[service_url(owner)] = obj
    for deployment in config["model_list"]:
        params = deployment["litellm_params"]
        service = urls[env[params["api_base"].removeprefix("os.environ/")]["value"]]
        assert params["model"] == f"hosted_vllm/{service['spec']['model']['name']}"
        assert deployment["model_name"] == service["spec"]["model"]["name"]
        key = env[params["api_key"].removeprefix("os.environ/")]["valueFrom"]["secretKeyRef"]
        assert key == service["spec"]["engine"]["apiKeySecretRef"]  # the key the servers require
    assert len({d["litellm_params"]["api_base"] for d in config["model_list"]}) == 2
