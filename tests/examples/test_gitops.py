"""The GitOps examples: kustomize overlays build (with kubectl's own kustomize) into
InferenceServices the CRD admits; Argo CD's health check reads the status the operator
writes; Flux's manifests point at what exists."""

from __future__ import annotations

import subprocess
from pathlib import Path

import lupa
import pytest
import yaml

from argosy.operator.owner import Owner
from argosy.operator.status import Problem, compute_status
from tests.operator.crd_schema import admit

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ["staging", "production"]


def kustomize(folder: Path) -> list[dict]:
    """What `kubectl apply -k folder` would apply."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(folder)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_build_admitted_inference_services(overlay):
    services = [
        d for d in kustomize(ROOT / "examples" / "kustomize" / "overlays" / overlay) if d["kind"] == "InferenceService"
    ]
    assert len(services) == 1
    stored, errors = admit(services[0])
    assert errors == [] and stored["metadata"]["namespace"] == "llm"
    if overlay == "production":
        assert stored["spec"]["autoscaling"]["maxReplicas"] == 8
    else:
        assert "autoscaling" not in stored["spec"] and stored["spec"]["engine"]["maxNumSeqs"] == 64


def health_script() -> str:
    config = yaml.safe_load((ROOT / "examples" / "argocd" / "health-check.yaml").read_text())
    return config["data"]["resource.customizations.health.argosy.dev_InferenceService"]


def argocd_health(obj: dict) -> tuple[str, str]:
    """Runs the health script the way Argo CD does: `obj` in, the `hs` table out."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    to_lua = lua.eval("function(f) return f end")

    def convert(value):
        if isinstance(value, dict):
            return lua.table_from({k: convert(v) for k, v in value.items()})
        if isinstance(value, list):
            return lua.table_from([convert(v) for v in value])
        return value

    result = lua.execute("local obj = ...\n" + health_script(), to_lua(convert(obj)))
    return result["status"], result["message"]


def service_with(deployment: dict | None, problem: Problem | None = None, generation: int = 2) -> dict:
    owner = Owner(name="assistant", namespace="llm", uid="u", generation=generation)
    status = compute_status(owner, deployment, [], problem, [], "2026-01-01T00:00:00Z")
    return {"metadata": {"name": "assistant", "generation": generation}, "status": status}


def deployment(ready: int) -> dict:
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": ready},
    }


def test_argocd_health_follows_the_operators_conditions():
    assert argocd_health({"metadata": {"generation": 1}})[0] == "Progressing"
    assert argocd_health(service_with(deployment(2)))[0] == "Healthy"
    assert argocd_health(service_with(deployment(1))) == ("Progressing", "Progressing: 1/2 replicas ready")
    degraded = service_with(None, Problem("KEDANotInstalled", "autoscaling needs KEDA"))
    assert argocd_health(degraded) == ("Degraded", "KEDANotInstalled: autoscaling needs KEDA")
    stale = service_with(deployment(2))
    stale["metadata"]["generation"] = 3  # a newer spec the operator has not seen
    assert argocd_health(stale)[0] == "Progressing"


def test_argocd_applications_point_at_the_chart_and_an_overlay():
    for name in ("argosy-operator.yaml", "assistant.yaml"):
        app = yaml.safe_load((ROOT / "examples" / "argocd" / name).read_text())
        assert app["kind"] == "Application" and (ROOT / app["spec"]["source"]["path"]).is_dir()


def test_flux_manifests_point_at_the_chart_and_an_overlay():
    docs = [
        d
        for f in ("argosy-operator.yaml", "assistant.yaml")
        for d in yaml.safe_load_all((ROOT / "examples" / "flux" / f).read_text())
        if d
    ]
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"GitRepository", "HelmRelease", "Kustomization"}
    assert (ROOT / kinds["HelmRelease"]["spec"]["chart"]["spec"]["chart"]).joinpath("Chart.yaml").is_file()
    assert (ROOT / kinds["Kustomization"]["spec"]["path"]).joinpath("kustomization.yaml").is_file()
    check = kinds["Kustomization"]["spec"]["healthChecks"][0]
    assert (check["apiVersion"], check["kind"]) == ("argosy.dev/v1alpha1", "InferenceService")
