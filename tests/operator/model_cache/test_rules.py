"""The model cache's pure rules: which nodes a ModelCache selects (labels, taints and
tolerations as Kubernetes matches them), the ready label's name, the quota's eviction order,
manifests, quantities; and the CRD's rejections, each naming the field."""

from __future__ import annotations

import json

import pytest
import yaml

from argosy.operator.kube_types import Toleration
from argosy.operator.model_cache.agent.main import parse_quantity
from argosy.operator.model_cache.agent.manifest import Manifest, ManifestError
from argosy.operator.model_cache.agent.quota import HeldCopy, make_room
from argosy.operator.model_cache.nodes import ready_label, selects, tolerates
from argosy.operator.model_cache.spec import ModelCacheSpec
from tests.operator.crd_schema import ROOT, admit, load_crd, openapi_schema

SHA = "0" * 64
GOOD = {"source": {"http": {"url": "https://models.example/llama"}}, "files": [{"path": "a", "size": 1, "sha256": SHA}]}


def node(labels=None, taints=None):
    return {"metadata": {"name": "n", "labels": labels or {}}, "spec": {"taints": taints or []}}


def test_a_node_is_selected_by_its_labels_and_tolerated_taints():
    spec = ModelCacheSpec.model_validate({**GOOD, "nodeSelector": {"gpu": "h100"}})
    assert selects(spec, node({"gpu": "h100", "zone": "a"}))
    assert not selects(spec, node({"gpu": "a100"}))
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert not selects(spec, node({"gpu": "h100"}, [gpu_taint]))
    assert selects(spec, node({"gpu": "h100"}, [{"key": "x", "effect": "PreferNoSchedule"}]))  # does not repel
    tolerant = spec.model_copy(update={"tolerations": [Toleration(key="nvidia.com/gpu", operator="Exists")]})
    assert selects(tolerant, node({"gpu": "h100"}, [gpu_taint]))


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        (Toleration(operator="Exists"), True),
        (Toleration(key="k", operator="Equal", value="v"), True),
        (Toleration(key="k", value="v", effect="NoExecute"), False),
        (Toleration(key="k", value="w"), False),
        (Toleration(key="other", operator="Exists"), False),
    ],
)
def test_tolerations_match_taints_as_kubernetes_does(toleration, expected):
    assert tolerates(toleration, {"key": "k", "value": "v", "effect": "NoSchedule"}) is expected


def test_the_ready_label_is_a_valid_label_name_kept_apart_when_shortened():
    assert ready_label("llm", "llama") == "modelcache.argosy.dev/llm.llama"
    long_a, long_b = ready_label("team-a", "x" * 80), ready_label("team-a", "x" * 79 + "y")
    assert long_a != long_b
    for label in (long_a, long_b):
        name = label.split("/", 1)[1]
        assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()


def copy(key, size, last_used, wanted=True, **flags):
    return HeldCopy(key, size, last_used, wanted, **flags)


def test_room_comes_from_copies_no_longer_wanted_least_recently_used_first():
    held = [copy("a", 40, 3, wanted=False), copy("b", 40, 1, wanted=False), copy("c", 40, 0)]
    assert make_room(held, 30, False, 140).evict == ["b"]
    assert make_room(held, 80, False, 140).evict == ["b", "a"]
    assert make_room(held, 10, False, 0).evict == []  # no quota


def test_only_a_pinned_copy_evicts_wanted_ones_and_never_one_in_use_pinned_or_busy():
    held = [
        copy("used", 30, 0, in_use=True),
        copy("old", 30, 1),
        copy("new", 30, 2),
        copy("pinned", 30, 0, pinned=True),
        copy("copying", 30, 0, busy=True),
    ]
    unpinned = make_room(held, 30, False, 160)
    assert not unpinned.fits and unpinned.evict == []
    assert "needs 0.00 GB" in unpinned.message and "used (in use)" in unpinned.message
    assert "pinned (pinned)" in unpinned.message and "copying (being copied)" in unpinned.message
    assert make_room(held, 30, True, 160).evict == ["old"]
    assert make_room(held, 50, True, 160).evict == ["old", "new"]
    assert not make_room(held, 100, True, 160).fits


def test_manifests_refuse_paths_outside_the_copy_and_twice_named_files():
    file = {"path": "config.json", "size": 3, "sha256": SHA}
    assert Manifest.from_json(json.dumps({"files": [file]})).total == 3
    for bad in ("../x", "/etc/passwd", ".argosy-copy.json"):
        with pytest.raises(ManifestError, match="relative, inside the copy"):
            Manifest.from_json(json.dumps({"files": [{**file, "path": bad}]}))
    with pytest.raises(ManifestError, match="twice"):
        Manifest.from_json(json.dumps({"files": [file, file]}))
    with pytest.raises(ManifestError, match="not a manifest"):
        Manifest.from_json('{"files": [{"path": "a", "size": -1, "sha256": "x"}]}')


def test_quantities_of_bytes():
    assert parse_quantity("500Gi") == 500 * 2**30 and parse_quantity("2T") == 2 * 10**12
    assert parse_quantity("0") == 0 and parse_quantity("1.5G") == 1_500_000_000
    with pytest.raises(ValueError, match="--quota"):
        parse_quantity("lots")


SCHEMA = openapi_schema(load_crd("modelcaches.argosy.dev"))


def admitted(spec):
    return admit(
        {"apiVersion": "argosy.dev/v1alpha1", "kind": "ModelCache", "metadata": {"name": "m"}, "spec": spec}, SCHEMA
    )[1]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"source": {}}, ["spec.source", "exactly one of http, persistentVolumeClaim, node"]),
        (
            {"source": {"http": {"url": "https://a"}, "node": {"name": "n", "path": "p"}}},
            ["spec.source", "exactly one"],
        ),
        ({"source": {"http": {"url": "ftp://a"}}}, ["spec.source.http.url"]),
        ({"source": {"node": {"name": "n", "path": "../etc"}}}, ["spec.source.node.path", "relative"]),
        ({"files": None, "manifestPath": None}, ["spec", "exactly one of files"]),
        ({"manifestPath": "manifest.json"}, ["spec", "exactly one of files"]),
        ({"files": [{"path": "/a", "size": 1, "sha256": SHA}]}, ["spec.files[].path", "relative"]),
        ({"files": [{"path": "a", "size": 1, "sha256": "ABC"}]}, ["spec.files.0.sha256"]),
        ({"files": [{"path": "a", "size": -1, "sha256": SHA}]}, ["spec.files.0.size", "minimum"]),
    ],
)
def test_the_crd_rejects_bad_specs_naming_the_field(change, words):
    spec = {**GOOD, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    failures = " ".join(admitted(spec))
    assert failures and all(word in failures for word in words), failures


def test_good_specs_are_admitted():
    assert admitted(GOOD) == []
    assert (
        admitted({"source": {"persistentVolumeClaim": {"claimName": "lib", "path": "llama"}}, "manifestPath": "m.json"})
        == []
    )
    assert admitted({**GOOD, "source": {"node": {"name": "node-a", "path": "imports/llama"}}, "pinned": True}) == []


def test_the_example_is_admitted():
    example = yaml.safe_load((ROOT / "examples" / "modelcache.yaml").read_text())
    assert admit(example, SCHEMA)[1] == []
    assert ModelCacheSpec.model_validate(example["spec"]).pinned
