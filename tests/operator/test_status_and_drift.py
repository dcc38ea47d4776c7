"""Status from what the cluster shows, and drift from what we built: pure functions."""

from __future__ import annotations

import jsonschema

from argosy.operator.drift import differences, merge_patch
from argosy.operator.owner import Owner
from argosy.operator.status import Problem, compute_status, diagnose_pods
from argosy.server.exceptions import CheckpointNotFoundError
from tests.operator.crd_schema import load_crd, openapi_schema, to_jsonschema

OWNER = Owner(name="svc", namespace="llm", uid="u1", generation=4)
NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(replicas=2, ready=2, updated=2, current=2, generation=7, observed=7):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "replicas": current,
            "updatedReplicas": updated,
            "readyReplicas": ready,
        },
    }


def conditions(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def pod(conditions=(), waiting=None, last_message=None, exit_code=1):
    container = {"name": "server", "image": "img", "state": {"waiting": waiting} if waiting else {"running": {}}}
    if last_message:
        container["lastState"] = {"terminated": {"exitCode": exit_code, "message": last_message}}
    return {"status": {"conditions": list(conditions), "containerStatuses": [container]}}


def test_a_rolled_out_deployment_is_ready():
    status = compute_status(OWNER, deployment(), [], None, [], NOW)
    assert conditions(status) == {
        "Ready": ("True", "Available"),
        "Reconciling": ("False", "Reconciled"),
        "Stalled": ("False", "NotStalled"),
    }
    assert status["observedGeneration"] == 4 and status["readyReplicas"] == 2 and status["replicas"] == 2


def test_a_rollout_in_progress_is_reconciling():
    for dep in (deployment(ready=1), deployment(observed=6), deployment(updated=1), deployment(current=3)):
        assert conditions(compute_status(OWNER, dep, [], None, [], NOW))["Ready"] == ("False", "Progressing")
        assert conditions(compute_status(OWNER, dep, [], None, [], NOW))["Reconciling"][0] == "True"


def test_every_status_fits_the_crds_status_schema():
    schema = to_jsonschema(openapi_schema(load_crd())["properties"]["status"], root=False)
    problem = Problem("ImagePullFailed", "no such image")
    for status in (
        compute_status(OWNER, deployment(), [], None, [], NOW),
        compute_status(OWNER, None, [], None, [], NOW),
        compute_status(OWNER, deployment(ready=0), [], problem, [], NOW, min_ready=1),
    ):
        jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).validate(status)


def test_scaled_to_zero_is_ready_and_a_missing_deployment_is_pending():
    assert conditions(compute_status(OWNER, deployment(0, 0, 0, 0), [], None, [], NOW))["Ready"] == (
        "True",
        "ScaledToZero",
    )
    assert conditions(compute_status(OWNER, None, [], None, [], NOW))["Ready"] == ("False", "Pending")


def test_pod_problems_are_named():
    unschedulable = pod(
        [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ]
    )
    pull = pod(waiting={"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope"'})
    missing = pod(
        waiting={"reason": "CrashLoopBackOff"},
        exit_code=CheckpointNotFoundError.exit_code,
        last_message='{"level": "error"}\n/models/llama: checkpoint folder not found\n',
    )
    crash = pod(waiting={"reason": "CrashLoopBackOff"}, last_message="Segmentation fault")
    # The exit code decides, not the wording: a bad checkpoint that is there is no missing path.
    corrupt = pod(waiting={"reason": "CrashLoopBackOff"}, last_message="/models/llama: no *.safetensors found")
    assert diagnose_pods([pod(), unschedulable]).reason == "PodsUnschedulable"
    assert "Insufficient nvidia.com/gpu" in diagnose_pods([unschedulable]).message
    assert diagnose_pods([pull]).reason == "ImagePullFailed"
    assert diagnose_pods([missing]).reason == "ModelPathMissing"
    assert diagnose_pods([missing]).message == "/models/llama: checkpoint folder not found"
    assert diagnose_pods([crash]).reason == diagnose_pods([corrupt]).reason == "CrashLoopBackOff"
    assert diagnose_pods([pod()]) is None
    status = compute_status(OWNER, deployment(ready=0), [pull], None, [], NOW)
    assert conditions(status)["Ready"] == ("False", "ImagePullFailed")
    assert conditions(status)["Stalled"] == ("True", "ImagePullFailed")


def test_transition_times_move_only_on_transitions():
    first = compute_status(OWNER, deployment(ready=1), [], None, [], NOW)["conditions"]
    same = compute_status(OWNER, deployment(ready=1), [], None, first, LATER)["conditions"]
    changed = compute_status(OWNER, deployment(), [], None, first, LATER)["conditions"]
    assert [c["lastTransitionTime"] for c in same] == [NOW, NOW, NOW]
    ready = {c["type"]: c["lastTransitionTime"] for c in changed}
    assert ready["Ready"] == LATER and ready["Reconciling"] == LATER and ready["Stalled"] == NOW


def test_drift_ignores_server_defaults_and_compares_quantities_by_value():
    desired = {
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [{"name": "server", "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "1Gi"}}}]
                }
            },
        }
    }
    live = {
        "spec": {
            "replicas": 2,
            "progressDeadlineSeconds": 600,
            "template": {
                "spec": {
                    "dnsPolicy": "ClusterFirst",
                    "containers": [
                        {
                            "name": "server",
                            "terminationMessagePath": "/dev/termination-log",
                            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "1024Mi"}},
                        }
                    ],
                }
            },
        },
        "status": {"replicas": 2},
    }
    assert differences(desired, live) == []
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "2Gi"
    live["spec"]["replicas"] = 5
    assert differences(desired, live) == ["/spec/replicas", "/spec/template/spec/containers/0/resources/limits/memory"]
    live["spec"]["template"]["spec"]["containers"].append({"name": "sidecar"})
    assert "/spec/template/spec/containers" in differences(desired, live)


def test_an_extra_selector_key_is_drift_and_the_patch_removes_it():
    desired = {"metadata": {"labels": {"a": "1"}}, "spec": {"selector": {"app": "svc"}}}
    live = {"metadata": {"labels": {"a": "1", "added-by": "someone"}}, "spec": {"selector": {"app": "svc", "x": "y"}}}
    assert differences(desired, live) == ["/spec/selector/x"]  # extra labels are not drift
    assert merge_patch(desired, live) == {
        "metadata": {"labels": {"a": "1"}},
        "spec": {"selector": {"app": "svc", "x": None}},
    }


def test_fields_dropped_from_the_spec_are_removed_but_not_the_replica_count():
    previous = {
        "spec": {
            "replicas": 3,
            "template": {"spec": {"tolerations": [{"key": "gpu"}], "nodeSelector": {"old": "1", "kept": "1"}}},
        }
    }
    desired = {"spec": {"template": {"spec": {"nodeSelector": {"kept": "1", "new": "1"}}}}}
    live = {
        "spec": {
            "replicas": 5,
            "template": {"spec": {"tolerations": [{"key": "gpu"}], "nodeSelector": {"old": "1", "kept": "1"}}},
        }
    }
    assert merge_patch(desired, live, previous) == {
        "spec": {"template": {"spec": {"nodeSelector": {"kept": "1", "new": "1", "old": None}, "tolerations": None}}}
    }


def test_empty_values_equal_absent_ones():
    desired = {
        "spec": {
            "tolerations": [{"key": "gpu", "value": ""}],
            "affinity": {"nodeAffinity": {}},
            "resources": {"limits": {}},
        }
    }
    live = {"spec": {"tolerations": [{"key": "gpu"}]}}
    assert differences(desired, live) == []


def test_with_autoscaling_a_scale_up_is_not_a_rollout():
    scaling_up = deployment(replicas=4, ready=2, updated=4, current=4)
    status = compute_status(
        OWNER,
        scaling_up,
        [pod([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}])],
        None,
        [],
        NOW,
        min_ready=1,
    )
    assert conditions(status)["Ready"] == ("True", "Available")
    old_pods_left = deployment(replicas=2, ready=2, updated=1, current=3)
    assert conditions(compute_status(OWNER, old_pods_left, [], None, [], NOW, min_ready=1))["Ready"][0] == "False"


def test_an_unschedulable_pod_is_waiting_not_stuck_and_bad_config_is_stuck():
    waiting = compute_status(
        OWNER,
        deployment(ready=0),
        [pod([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])],
        None,
        [],
        NOW,
    )
    assert conditions(waiting) == {
        "Ready": ("False", "PodsUnschedulable"),
        "Reconciling": ("True", "PodsUnschedulable"),
        "Stalled": ("False", "NotStalled"),
    }
    secret = pod(waiting={"reason": "CreateContainerConfigError", "message": 'secret "llm-keys" not found'})
    stuck = compute_status(OWNER, deployment(ready=0), [secret], None, [], NOW)
    assert conditions(stuck)["Stalled"] == ("True", "ContainerConfigError")


def test_a_rollout_past_its_deadline_is_stalled():
    dep = deployment(ready=0)
    dep["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "svc-1" has timed out progressing.',
        }
    ]
    status = compute_status(OWNER, dep, [], None, [], NOW)
    assert conditions(status)["Stalled"] == ("True", "ProgressDeadlineExceeded")
