"""The pure builders: every object they produce is valid for real Kubernetes (strict schema
validation, several versions) and for the add-ons' own CRDs, and says what the spec asks."""

from __future__ import annotations

import argparse
import re

import kubernetes_validate
import pytest

from argosy.operator.adapters_config import build_adapters_config_map
from argosy.operator.deployment import build_deployment, server_args, shm_size, with_swap_space
from argosy.operator.owner import Owner
from argosy.operator.reconcile import desired_objects
from argosy.operator.scaledobject import build_scaled_object, waiting_requests_query
from argosy.operator.service import build_pdb, build_service
from argosy.operator.spec import EngineSpec, InferenceServiceSpec, SpeculativeSpec, engine_flags
from argosy.server.api.serve_command import add_serve_args, server_config
from argosy.server.engine_config import EngineConfig
from argosy.server.lora.config_file import parse_adapters
from argosy.server.spec_decode.config import SpeculativeConfig
from tests.operator.crd_schema import ADD_ON_CRDS, add_on_rejections, admit
from tests.operator.specs import SPECS

KUBERNETES_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]
OWNER = Owner(name="svc", namespace="llm", uid="2f0c8a64-7c35-4b0c-9a51-0d2b7c3f1e11", generation=3)


def spec_of(name: str) -> InferenceServiceSpec:
    """The spec as the API server would store it: admitted, with the CRD's defaults."""
    stored, errors = admit(
        {
            "apiVersion": "argosy.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "svc", "namespace": "llm"},
            "spec": SPECS[name],
        }
    )
    assert errors == []
    return InferenceServiceSpec.model_validate(stored["spec"])


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_built_in_objects_validate_strictly(name, version):
    spec = spec_of(name)
    for _, obj in desired_objects(OWNER, spec):
        if obj["kind"] not in ADD_ON_CRDS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_add_on_objects_validate_against_their_crds(name):
    for _, obj in desired_objects(OWNER, spec_of(name)):
        if obj["kind"] in ADD_ON_CRDS:
            assert add_on_rejections(obj) == [], obj["kind"]
        if obj["kind"] == "ScaledObject":  # KEDA reads trigger metadata as strings only
            assert all(isinstance(v, str) for t in obj["spec"]["triggers"] for v in t["metadata"].values())


def test_add_on_objects_are_checked_for_real():
    """The CRDs' schemas and CEL rules do reject what they should (the test above can fail)."""
    objects = {kind.kind: obj for kind, obj in desired_objects(OWNER, spec_of("routed-from-zero"))}
    pool, route, scaled = objects["InferencePool"], objects["HTTPRoute"], objects["ScaledObject"]
    assert add_on_rejections({**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 8000}] * 2}})
    picker = {k: v for k, v in pool["spec"]["endpointPickerRef"].items() if k != "port"}
    assert any(
        "port is required" in e
        for e in add_on_rejections({**pool, "spec": {**pool["spec"], "endpointPickerRef": picker}})
    )
    assert add_on_rejections(
        {
            **route,
            "spec": {**route["spec"], "rules": [{**route["spec"]["rules"][0], "timeouts": {"request": "5 minutes"}}]},
        }
    )
    assert add_on_rejections({**scaled, "spec": {**scaled["spec"], "cooldownPeriod": -1}})


def test_deployment_runs_argosy_serve_with_the_engine_flags():
    spec = spec_of("tuned-engine")
    deployment = build_deployment(OWNER, spec)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    flags = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}
    assert container["command"] == ["argosy"] and args[0] == "serve"
    assert flags["--model"] == "/models/llama-3-8b-instruct"
    assert flags["--served-model-name"] == "llama-3-8b-instruct"
    assert flags["--max-model-len"] == "8192" and flags["--max-num-batched-tokens"] == "8192"
    assert flags["--block-size"] == "32" and flags["--dtype"] == "bfloat16"
    assert flags["--gpu-memory-utilization"] == "0.85" and flags["--max-num-seqs"] == "128"
    assert flags["--shutdown-timeout"] == "120" and flags["--max-waiting-requests"] == "64"
    assert flags["--engine-step-timeout"] == "300"
    assert "--no-enable-prefix-caching" in args and "--no-enable-chunked-prefill" in args
    assert flags["--attention-backend"] == "triton" and flags["--quantization"] == "fp8"
    assert "--no-enforce-eager" in args
    sizes = [args[i + 1] for i, a in enumerate(args) if a == "--cuda-graph-sizes"]
    assert sizes == ["1", "2", "4", "8", "16"]
    assert {
        "name": "ARGOSY_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llm-keys", "key": "api-key"}},
    } in container["env"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 120  # above the drain timeout
    # The parser of `argosy serve` accepts exactly these flags.
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    config = server_config(parser.parse_args(args[1:]))
    assert config.engine.max_num_seqs == 128 and config.engine.enable_chunked_prefill is False
    assert config.shutdown_timeout == 120 and config.engine.block_size == 32
    assert config.engine_step_timeout == 300


def test_pod_is_hardened_probed_and_mounts_the_model_read_only():
    pod = build_deployment(OWNER, spec_of("plain-gpu"))["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    spec = pod["spec"]
    container = spec["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert {"name": "model", "hostPath": {"path": "/mnt/nvme/models", "type": "Directory"}} in spec["volumes"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in spec["volumes"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/tmp" in mounts and "/dev/shm" in mounts
    assert spec["nodeSelector"] == {"argosy.dev/model-llama-3-8b": "true"}
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 1800
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    liveness = container["livenessProbe"]
    assert liveness["httpGet"]["path"] == "/live"  # /health is 503 while draining
    # A hung engine makes the server exit; liveness restarts an API process that stops answering
    # within half a minute, and a single slow answer restarts nothing.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= 30 and liveness["failureThreshold"] > 1
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_pvc_and_scheduling_options_reach_the_pod():
    pvc = build_deployment(OWNER, spec_of("pvc"))
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pvc["spec"][
        "template"
    ]["spec"]["volumes"]
    assert pvc["spec"]["replicas"] == 3
    pod = build_deployment(OWNER, spec_of("scheduling"))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "argosy.dev/model-llama-3-8b": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and "podAntiAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "inference" and pod["serviceAccountName"] == "llm"
    assert build_pdb(OWNER, spec_of("scheduling"))["spec"]["maxUnavailable"] == "50%"


def test_rollouts_need_no_spare_gpu_by_default_and_may_surge_when_asked():
    default = build_deployment(OWNER, spec_of("plain-gpu"))["spec"]
    assert default["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert default["progressDeadlineSeconds"] >= 1800  # a model load is not a stuck rollout
    surge = build_deployment(OWNER, spec_of("surge-rollout"))["spec"]["strategy"]["rollingUpdate"]
    assert surge == {"maxSurge": 1, "maxUnavailable": 0}
    assert build_pdb(OWNER, spec_of("surge-rollout"))["spec"]["maxUnavailable"] == "25%"


def test_autoscaling_leaves_replicas_to_keda():
    assert "replicas" not in build_deployment(OWNER, spec_of("autoscaled"))["spec"]
    scaled = build_scaled_object(OWNER, spec_of("fractional-target"))
    assert scaled["spec"]["minReplicaCount"] == 2
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["metricType"] == "AverageValue" and trigger["metadata"]["threshold"] == "2.5"
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0


def test_the_query_matches_exactly_this_services_pods():
    query = waiting_requests_query(OWNER)
    assert 'argosy_num_requests_waiting{namespace="llm",pod=~"' in query
    pod_regex = re.search(r'pod=~"([^"]+)"', query).group(1)
    for name, wanted in [
        ("svc-7d9f8b6c5d-x2k4p", True),
        ("svc-5c8f-abcde", True),
        ("svc2-7d9f8b6c5d-x2k4p", False),
        ("svc-canary-7d9f8b6c5d-x2k4p", False),
        ("other-7d9f8b6c5d-x2k4p", False),
    ]:
        assert bool(re.fullmatch(pod_regex, name)) == wanted, name  # Prometheus anchors regexes


def test_building_is_deterministic():
    spec = spec_of("scheduling")
    assert desired_objects(OWNER, spec) == desired_objects(OWNER, spec_of("scheduling"))
    assert build_service(OWNER)["spec"]["selector"] == build_deployment(OWNER, spec)["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("name", ["plain-gpu", "tuned-engine", "cpu-node"])
def test_every_engine_setting_reaches_argosy_serve(name):
    spec = spec_of(name)
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    parsed = parser.parse_args(server_args(spec)[1:])
    flags = engine_flags()
    assert set(EngineSpec.model_fields) - set(flags) == {"apiKeySecretRef", "hashSeed"}  # env variables, not flags
    for field, flag in flags.items():
        value = getattr(spec.engine, field)
        expected = value.flag_value() if isinstance(value, SpeculativeSpec) else value
        assert getattr(parsed, flag[2:].replace("-", "_")) == expected, field


@pytest.mark.parametrize("name", ["tuned-engine", "cpu-node"])
def test_speculative_decoding_reaches_the_engine_with_the_draft_where_it_is_mounted(name):
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    config = server_config(parser.parse_args(server_args(spec_of(name))[1:]))
    speculative = SpeculativeConfig.parse(config.engine.speculative_config)
    if name == "tuned-engine":
        assert (speculative.method, speculative.num_speculative_tokens, speculative.model) == (
            "draft_model",
            4,
            "/models/llama-3.2-1b",
        )
    else:
        assert (speculative.method, speculative.num_speculative_tokens, speculative.prompt_lookup_max) == (
            "ngram",
            3,
            4,
        )
        assert (
            speculative.disable_by_batch_size
            == SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3}).disable_by_batch_size
        )  # the server's default


def test_tensor_parallelism_reaches_the_server_with_shm_for_the_collectives():
    pod = build_deployment(OWNER, spec_of("tensor-parallel"))["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    [shm] = [v for v in pod["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["sizeLimit"] == "2048Mi"  # 1Gi a rank, above the default 1Gi
    assert shm_size(spec_of("plain-gpu")) == "1Gi"


def test_swap_space_grows_the_pods_memory_request_and_limit():
    container = build_deployment(OWNER, spec_of("cpu-node"))["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "8", "memory": f"{16 * 1024 + 2560}Mi"}
    assert "--swap-space" in container["args"] and "limits" not in container["resources"]
    both = {"requests": {"memory": "1G"}, "limits": {"memory": "2Gi", "nvidia.com/gpu": 1}}
    assert with_swap_space(both, 0.5) == {
        "requests": {"memory": f"{-(-(10**9) // (1 << 20)) + 512}Mi"},
        "limits": {"memory": f"{2048 + 512}Mi", "nvidia.com/gpu": 1},
    }
    assert both["limits"]["memory"] == "2Gi"  # the spec's own resources are left alone
    assert with_swap_space({}, 1) == {"requests": {"memory": "1024Mi"}}
    assert with_swap_space(both, 0) is both


def test_engine_defaults_are_the_servers():
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    defaults = server_config(parser.parse_args([]))
    config = server_config(parser.parse_args(server_args(spec_of("plain-gpu"))[1:]))
    assert config.engine == EngineConfig(model="/models/llama-3-8b-instruct", served_model_name="llama-3-8b-instruct")
    assert (config.max_waiting_requests, config.shutdown_timeout) == (
        defaults.max_waiting_requests,
        defaults.shutdown_timeout,
    )


def test_adapters_are_a_watched_config_map_and_changing_them_rolls_nothing():
    spec = spec_of("lora")
    args = server_args(spec)
    flags = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}
    assert "--enable-lora" in args and flags["--lora-config-file"] == "/etc/argosy/adapters/adapters.json"
    assert (flags["--max-loras"], flags["--max-lora-rank"], flags["--max-cpu-loras"]) == ("4", "64", "8")
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    config = server_config(parser.parse_args(args[1:]))
    assert config.engine.enable_lora and config.engine.max_loras == 4 and config.lora_config_file is not None
    objects = {kind.kind: obj for kind, obj in desired_objects(OWNER, spec)}
    listing = parse_adapters(objects["ConfigMap"]["data"]["adapters.json"])
    assert listing.errors == [] and [(e.name, e.path) for e in listing.entries] == [
        ("sql-tuned", "/models/adapters/sql"),
        ("support/v2", "/models/adapters/support-v2"),
    ]
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "adapters", "configMap": {"name": "svc"}} in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "adapters")
    assert mount == {"name": "adapters", "mountPath": "/etc/argosy/adapters", "readOnly": True}  # no subPath
    # Other adapters: another ConfigMap, the very same Deployment.
    changed = spec.model_copy(update={"adapters": spec.adapters[:1]})
    assert build_deployment(OWNER, changed) == objects["Deployment"]
    assert build_adapters_config_map(OWNER, changed) != objects["ConfigMap"]
    # Without LoRA: no ConfigMap, no flag.
    plain = spec_of("plain-gpu")
    assert "ConfigMap" not in {kind.kind for kind, _ in desired_objects(OWNER, plain)}
    assert "--enable-lora" not in server_args(plain)


def test_adapters_alone_turn_lora_on_with_the_servers_limits():
    args = server_args(spec_of("adapters-only"))
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    engine = server_config(parser.parse_args(args[1:])).engine
    default = EngineConfig()
    assert engine.enable_lora and (engine.max_loras, engine.max_lora_rank) == (default.max_loras, default.max_lora_rank)
