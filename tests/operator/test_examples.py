"""Every example in examples/ is admitted by the CRD and builds valid objects; and a real
client, kubectl, applies one against the emulator and reaches the operator."""

from __future__ import annotations

import asyncio
import os

import kubernetes_validate
import pytest
import yaml

from argosy.operator.owner import Owner
from argosy.operator.reconcile import desired_objects
from argosy.operator.spec import InferenceServiceSpec
from tests.operator.cluster import DEPLOYMENTS, SERVICES, eventually, live, running_operator
from tests.operator.crd_schema import ADD_ON_CRDS, ROOT, add_on_rejections, admit

EXAMPLES = sorted((ROOT / "examples").glob("inferenceservice-*.yaml"))
GPU_EXAMPLE = ROOT / "examples" / "inferenceservice-gpu.yaml"


def test_there_are_examples_of_each_kind():
    names = {p.stem for p in EXAMPLES}
    assert {
        "inferenceservice-gpu",
        "inferenceservice-pvc",
        "inferenceservice-autoscaled",
        "inferenceservice-routed",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_admitted_and_builds_valid_objects(path):
    stored, errors = admit(yaml.safe_load(path.read_text()))
    assert errors == []
    owner = Owner(name=stored["metadata"]["name"], namespace=stored["metadata"]["namespace"], uid="u")
    for _, obj in desired_objects(owner, InferenceServiceSpec.model_validate(stored["spec"])):
        if obj["kind"] in ADD_ON_CRDS:
            assert add_on_rejections(obj) == [], obj["kind"]
        else:
            kubernetes_validate.validate(obj, "1.32", strict=True)


async def kubectl(*args: str) -> tuple[int, str, str]:
    """The real kubectl client against the emulator (the cluster fixture's kubeconfig)."""
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        os.environ["KUBECONFIG"],
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_kubectl_apply_reaches_the_operator(cluster):
    async with running_operator():
        returncode, out, err = await kubectl("apply", "--validate=false", "-f", str(GPU_EXAMPLE))
        assert returncode == 0, err
        assert "inferenceservice.argosy.dev/llama3-8b created" in out
        deployment = await eventually(lambda: live(cluster, DEPLOYMENTS, "llama3-8b"), timeout=20)
        assert "--served-model-name" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        # The reconcile creates the Service after the Deployment: under load, a moment later.
        await eventually(lambda: live(cluster, SERVICES, "llama3-8b"), timeout=20)


async def test_kubectl_scale_sets_the_replica_count_through_the_scale_subresource(cluster):
    async with running_operator():
        assert (await kubectl("apply", "--validate=false", "-f", str(GPU_EXAMPLE)))[0] == 0
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama3-8b"))
        returncode, _, err = await kubectl("-n", "llm", "scale", "ais", "llama3-8b", "--replicas=3")
        assert returncode == 0, err
        await eventually(lambda: live(cluster, DEPLOYMENTS, "llama3-8b")["spec"]["replicas"] == 3, timeout=20)
