"""llm-d's Endpoint Picker with its precise prefix-cache scorer for an Argosy pool, as a rendered
configuration (the picker, a Go program, does not run here): the picker's file and the
InferenceService's pods agree on what the scorer needs to match blocks (block size, hash algorithm
and seed, where events go, how the pod is named in the topic), and the file is well formed."""

from __future__ import annotations

import json

import yaml

from argosy.operator.deployment import build_deployment, server_args
from argosy.operator.owner import Owner
from argosy.operator.spec import InferenceServiceSpec
from tests.operator.crd_schema import ROOT, admit

SERVICE = ROOT / "examples" / "inferenceservice-llm-d-precise.yaml"
PICKER = ROOT / "examples" / "llm-d" / "epp-precise-prefix-cache.yaml"


def pods_and_picker():
    stored, errors = admit(yaml.safe_load(SERVICE.read_text()))
    assert errors == []
    spec = InferenceServiceSpec.model_validate(stored["spec"])
    owner = Owner(name=stored["metadata"]["name"], namespace=stored["metadata"]["namespace"], uid="u")
    picker = yaml.safe_load(PICKER.read_text())
    scorer = next(p for p in picker["plugins"] if p["type"] == "precise-prefix-cache-scorer")["parameters"]
    return owner, spec, picker, scorer


def test_the_pods_and_the_scorer_agree_on_what_matching_blocks_needs():
    owner, spec, _, scorer = pods_and_picker()
    args = server_args(spec)
    events = json.loads(args[args.index("--kv-events-config") + 1])
    tokens = scorer["indexerConfig"]["tokenProcessorConfig"]
    assert int(args[args.index("--block-size") + 1]) == tokens["blockSize"] == spec.engine.blockSize
    assert args[args.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
    container = build_deployment(owner, spec)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["PYTHONHASHSEED"]["value"] == tokens["hashSeed"]
    # The pods connect to the picker's Service on the port it binds, under a topic it accepts,
    # naming each pod by its address (expanded by the kubelet from the POD_IP variable).
    host, _, port = events["endpoint"].removeprefix("tcp://").rpartition(":")
    assert host.startswith(f"{spec.routing.endpointPicker.name}.{owner.namespace}.svc")
    assert port == scorer["kvEventsConfig"]["zmqEndpoint"].rpartition(":")[2]
    assert scorer["kvEventsConfig"]["zmqEndpoint"].startswith("tcp://*:")  # the picker binds
    assert events["topic"].startswith(scorer["kvEventsConfig"]["topicFilter"]) and "$(POD_IP)" in events["topic"]
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert not any(p["name"] == "kv-events" for p in container["ports"])  # nothing listens on the pods


def test_the_picker_file_is_well_formed():
    _, _, picker, _ = pods_and_picker()
    assert picker["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert picker["kind"] == "EndpointPickerConfig"
    declared = [p["type"] for p in picker["plugins"]]
    assert len(set(declared)) == len(declared)
    for profile in picker["schedulingProfiles"]:
        refs = [p["pluginRef"] for p in profile["plugins"]]
        assert set(refs) <= set(declared) and refs[-1] == "max-score-picker"
