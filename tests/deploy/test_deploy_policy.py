"""The admission policies' CEL, taken from `helm template` and evaluated with celpy.

Each case submits an object to the rendered policies the way the API server would (see
vap_emulator) and checks whether it is refused, warned about, or let through.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from deploy_support import REPO, RenderFn
from vap_emulator import PolicyError, admit, failures

FIX = "set spec.hostNetwork: true, or install with non-hostNetwork RDMA enabled " \
      "(needs an IPv6 compute network)"
IPC = "lacks the IPC_LOCK capability"

Obj = dict[str, Any]


def ctr(name: str = "main", limits: dict[str, Any] | None = None,
        requests: dict[str, Any] | None = None, caps: list[str] | None = None,
        privileged: bool | None = None) -> Obj:
    c: Obj = {"name": name, "image": "registry.example.com/app:1"}
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    if resources:
        c["resources"] = resources
    sc: Obj = {}
    if caps is not None:
        sc["capabilities"] = {"add": caps}
    if privileged is not None:
        sc["privileged"] = privileged
    if sc:
        c["securityContext"] = sc
    return c


RDMA = {"rdma/hca": 1}
LOCKED = ["IPC_LOCK"]


def spec(*containers: Obj, host: bool | None = None, init: list[Obj] | None = None,
         ephemeral: list[Obj] | None = None) -> Obj:
    s: Obj = {"containers": list(containers)}
    if init:
        s["initContainers"] = init
    if ephemeral:
        s["ephemeralContainers"] = ephemeral
    if host is not None:
        s["hostNetwork"] = host
    return s


def pod(pod_spec: Obj, name: str = "p") -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


def workload(kind: str, pod_spec: Obj, name: str = "w") -> Obj:
    template = {"metadata": {"labels": {"app": name}}, "spec": pod_spec}
    if kind == "CronJob":
        body: Obj = {"schedule": "0 * * * *",
                     "jobTemplate": {"spec": {"template": template}}}
    elif kind == "Job":
        body = {"template": template}
    else:
        body = {"selector": {"matchLabels": {"app": name}}, "template": template}
    group = "batch/v1" if kind in ("Job", "CronJob") else "apps/v1"
    return {"apiVersion": group, "kind": kind, "metadata": {"name": name}, "spec": body}


# (case id, object, denied with switch off, IPC_LOCK warning expected)
CASES: list[tuple[str, Obj, bool, bool]] = [
    ("pod-host-limits", pod(spec(ctr(limits=RDMA, caps=LOCKED), host=True)), False, False),
    ("pod-nohost-limits", pod(spec(ctr(limits=RDMA, caps=LOCKED))), True, False),
    ("pod-host-false", pod(spec(ctr(limits=RDMA, caps=LOCKED), host=False)), True, False),
    ("pod-nohost-requests", pod(spec(ctr(requests=RDMA, caps=LOCKED))), True, False),
    ("pod-nohost-other-resources",
     pod(spec(ctr(limits={"nvidia.com/gpu": 8, "cpu": "1"}))), False, False),
    ("pod-nohost-no-resources", pod(spec(ctr())), False, False),
    ("pod-nohost-similar-name",
     pod(spec(ctr(limits={"rdma/hca-x": 1, "example.com/rdma": 1}))), False, False),
    ("pod-nohost-init", pod(spec(ctr(), init=[ctr("init", limits=RDMA, caps=LOCKED)])),
     True, False),
    # The API server refuses resources on ephemeral containers, so the policy ignores them.
    ("pod-nohost-ephemeral",
     pod(spec(ctr(), ephemeral=[ctr("debug", limits=RDMA, caps=LOCKED)])), False, False),
    ("pod-nohost-second-container",
     pod(spec(ctr("a"), ctr("b", limits=RDMA, caps=LOCKED))), True, False),
    ("pod-host-no-ipc-lock", pod(spec(ctr(limits=RDMA), host=True)), False, True),
    ("pod-host-other-caps",
     pod(spec(ctr(limits=RDMA, caps=["SYS_RESOURCE"]), host=True)), False, True),
    ("pod-host-cap-prefixed",
     pod(spec(ctr(limits=RDMA, caps=["CAP_IPC_LOCK"]), host=True)), False, False),
    ("pod-host-privileged", pod(spec(ctr(limits=RDMA, privileged=True), host=True)),
     False, False),
    ("pod-host-caps-all", pod(spec(ctr(limits=RDMA, caps=["ALL"]), host=True)), False, False),
    ("pod-host-one-of-two-unlocked",
     pod(spec(ctr("a", limits=RDMA, caps=LOCKED), ctr("b", limits=RDMA), host=True)),
     False, True),
    ("pod-nohost-no-ipc-lock", pod(spec(ctr(limits=RDMA))), True, True),
    ("deployment-host", workload("Deployment", spec(ctr(limits=RDMA, caps=LOCKED), host=True)),
     False, False),
    ("deployment-nohost", workload("Deployment", spec(ctr(limits=RDMA, caps=LOCKED))),
     True, False),
    ("statefulset-nohost", workload("StatefulSet", spec(ctr(limits=RDMA, caps=LOCKED))),
     True, False),
    ("daemonset-nohost", workload("DaemonSet", spec(ctr(limits=RDMA, caps=LOCKED))),
     True, False),
    ("replicaset-nohost", workload("ReplicaSet", spec(ctr(limits=RDMA, caps=LOCKED))),
     True, False),
    ("job-nohost", workload("Job", spec(ctr(limits=RDMA, caps=LOCKED))), True, False),
    ("job-host", workload("Job", spec(ctr(limits=RDMA, caps=LOCKED), host=True)),
     False, False),
    ("cronjob-nohost", workload("CronJob", spec(ctr(limits=RDMA, caps=LOCKED))), True, False),
    ("cronjob-host", workload("CronJob", spec(ctr(limits=RDMA, caps=LOCKED), host=True)),
     False, False),
    ("cronjob-nohost-other-resources",
     workload("CronJob", spec(ctr(limits={"cpu": "1"}))), False, False),
    ("configmap-not-matched",
     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
      "data": {"x": "rdma/hca"}}, False, False),
]


@pytest.fixture(scope="module")
def default_policies(render: RenderFn) -> list[Obj]:
    return [o for o in render() if o["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.fixture(scope="module")
def switch_on_policies(render: RenderFn) -> list[Obj]:
    return [o for o in render({"nonHostNetwork.enabled": "true"})
            if o["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(("obj", "denied", "warned"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_policy_with_switch_off(default_policies: list[Obj], obj: Obj, denied: bool,
                                warned: bool) -> None:
    outcome = admit(default_policies, obj)
    assert outcome.admitted is not denied, outcome
    if denied:
        (message,) = outcome.denied
        assert FIX in message
        assert f"{obj['kind']} {obj['metadata']['name']}:" in message
        assert "rdma/hca" in message
    assert any(IPC in w for w in outcome.warnings) is warned, outcome.warnings


@pytest.mark.parametrize(("obj", "warned"), [(c[1], c[3]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_policy_with_switch_on_never_denies(switch_on_policies: list[Obj], obj: Obj,
                                            warned: bool) -> None:
    outcome = admit(switch_on_policies, obj)
    assert outcome.admitted, outcome
    assert any(IPC in w for w in outcome.warnings) is warned


def test_message_names_where_the_pod_spec_is(default_policies: list[Obj]) -> None:
    job = workload("CronJob", spec(ctr("trainer", limits=RDMA, caps=LOCKED)), name="nightly")
    (message,) = admit(default_policies, job).denied
    assert message.startswith("CronJob nightly: container trainer asks for rdma/hca")
    assert "spec.jobTemplate.spec.template.spec.hostNetwork is not true" in message


def test_warning_names_the_container(default_policies: list[Obj]) -> None:
    p = pod(spec(ctr("ok", limits=RDMA, caps=LOCKED), ctr("bad", limits=RDMA), host=True))
    (warning,) = admit(default_policies, p).warnings
    assert "container bad asks for rdma/hca" in warning
    assert "add IPC_LOCK to securityContext.capabilities.add" in warning


def test_generate_name_is_shown_when_there_is_no_name(default_policies: list[Obj]) -> None:
    p = pod(spec(ctr(limits=RDMA, caps=LOCKED)))
    p["metadata"] = {"generateName": "worker-"}
    (message,) = admit(default_policies, p).denied
    assert message.startswith("Pod worker-*: ")


def test_workload_pod_spec_changes_are_checked_but_pod_updates_are_not(
        default_policies: list[Obj]) -> None:
    bad_pod = pod(spec(ctr(limits=RDMA, caps=LOCKED)))
    bad_deployment = workload("Deployment", spec(ctr(limits=RDMA, caps=LOCKED)))
    new_image = copy.deepcopy(bad_deployment)
    new_image["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example.com/app:2"
    outcome = admit(default_policies, new_image, "UPDATE", old=bad_deployment)
    assert FIX in outcome.denied[0]
    # A template that starts asking for the resource is judged like a new one.
    plain = workload("Deployment", spec(ctr(caps=LOCKED)))
    assert not admit(default_policies, bad_deployment, "UPDATE", old=plain).admitted
    assert admit(default_policies, bad_pod, "UPDATE", old=bad_pod).admitted
    assert admit(default_policies, bad_deployment, "DELETE").admitted


def test_terminating_workload_is_not_blocked(default_policies: list[Obj]) -> None:
    # Removing a finalizer from an old, non-conforming workload must still work.
    old = workload("Deployment", spec(ctr(limits=RDMA, caps=LOCKED)))
    old["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    old["metadata"]["finalizers"] = ["example.com/cleanup"]
    d = copy.deepcopy(old)
    del d["metadata"]["finalizers"]
    d["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example.com/app:2"
    assert admit(default_policies, d, "UPDATE", old=old).admitted


def non_compliant(kind: str) -> Obj:
    """A workload that existed before the policy: RDMA without hostNetwork, no IPC_LOCK."""
    obj = workload(kind, spec(ctr("trainer", limits=RDMA)))
    obj["metadata"]["namespace"] = "ml"
    obj["metadata"]["labels"] = {"app": "trainer"}
    return obj


def updated(old: Obj, change: Any) -> Obj:
    new = copy.deepcopy(old)
    change(new)
    return new


# The controllers' and kubectl's own updates of a workload the policy would refuse today.
HOUSEKEEPING: list[tuple[str, str, Any]] = [
    # kubectl scale deployment --replicas=0: the deployment controller scales the ReplicaSet.
    ("scale-replicaset", "ReplicaSet", lambda o: o["spec"].__setitem__("replicas", 0)),
    ("scale-deployment", "Deployment", lambda o: o["spec"].__setitem__("replicas", 3)),
    ("scale-statefulset", "StatefulSet", lambda o: o["spec"].__setitem__("replicas", 0)),
    ("suspend-job", "Job", lambda o: o["spec"].__setitem__("suspend", True)),
    ("suspend-cronjob", "CronJob", lambda o: o["spec"].__setitem__("suspend", True)),
    # kubectl delete --cascade=orphan: the garbage collector drops the owner reference.
    ("orphan-replicaset", "ReplicaSet", lambda o: o["metadata"].pop("ownerReferences")),
    ("relabel-deployment", "Deployment",
     lambda o: o["metadata"]["labels"].__setitem__("team", "infra")),
    ("annotate-daemonset", "DaemonSet",
     lambda o: o["metadata"].setdefault("annotations", {}).__setitem__("note", "x")),
    # A CronJob's job-level fields outside the pod spec.
    ("cronjob-schedule", "CronJob", lambda o: o["spec"].__setitem__("schedule", "5 * * * *")),
    ("status-replicaset", "ReplicaSet",
     lambda o: o.__setitem__("status", {"replicas": 0, "observedGeneration": 2})),
]


@pytest.mark.parametrize(("kind", "change"), [c[1:] for c in HOUSEKEEPING],
                         ids=[c[0] for c in HOUSEKEEPING])
def test_updates_that_leave_the_pod_spec_alone_always_pass(
        default_policies: list[Obj], kind: str, change: Any) -> None:
    old = non_compliant(kind)
    old["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "trainer", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}]
    new = updated(old, change)
    assert new != old
    # The same objects are refused when created (and warned about): the policy is on.
    assert not admit(default_policies, old).admitted
    outcome = admit(default_policies, new, "UPDATE", old=old)
    assert outcome.admitted and not outcome.warnings, outcome


def test_changing_the_cronjobs_pod_spec_is_judged(default_policies: list[Obj]) -> None:
    old = non_compliant("CronJob")
    new = updated(old, lambda o: o["spec"]["jobTemplate"]["spec"]["template"]["spec"][
        "containers"][0].__setitem__("image", "registry.example.com/app:2"))
    (message,) = admit(default_policies, new, "UPDATE", old=old).denied
    assert message.startswith("CronJob w: container trainer asks for rdma/hca")


def test_fixing_a_workload_is_admitted(default_policies: list[Obj]) -> None:
    old = non_compliant("Deployment")
    fixed = updated(old, lambda o: o["spec"]["template"]["spec"].__setitem__(
        "hostNetwork", True))
    outcome = admit(default_policies, fixed, "UPDATE", old=old)
    assert outcome.admitted
    assert any(IPC in w for w in outcome.warnings)


def test_custom_resource_name_is_what_the_policy_looks_for(render: RenderFn) -> None:
    policies = render({"resourceName": "example.com/rdma"})
    custom = pod(spec(ctr(limits={"example.com/rdma": 1}, caps=LOCKED)))
    outcome = admit(policies, custom)
    (message,) = outcome.denied
    assert "asks for example.com/rdma" in message
    # The default name is just another resource now.
    assert admit(policies, pod(spec(ctr(limits=RDMA)))).admitted
    assert not admit(policies, pod(spec(ctr(limits=RDMA)))).warnings


def test_every_validation_has_a_static_message_too(default_policies: list[Obj]) -> None:
    # The API server falls back to `message` if messageExpression fails.
    for policy in (o for o in default_policies if o["kind"] == "ValidatingAdmissionPolicy"):
        for validation in policy["spec"]["validations"]:
            assert validation["message"].strip()
            assert validation["messageExpression"].strip()
    deny = next(o for o in default_policies
                if o["metadata"]["name"] == "ack-rdma-dp-require-hostnetwork")
    assert " ".join(deny["spec"]["validations"][0]["message"].split()).endswith(FIX)


def load_example(name: str) -> Obj:
    loaded: Obj = yaml.safe_load((REPO / "examples" / name).read_text())
    return loaded


def test_seed_example_is_admitted_without_warnings(default_policies: list[Obj]) -> None:
    outcome = admit(default_policies, load_example("hps-benchmark-job.yaml"))
    assert outcome.admitted and not outcome.warnings, outcome


def test_non_hostnetwork_example_needs_the_switch(default_policies: list[Obj],
                                                  switch_on_policies: list[Obj]) -> None:
    job = load_example("hps-benchmark-job-non-hostnetwork.yaml")
    (message,) = admit(default_policies, job).denied
    assert message.startswith("Job hps-benchmark-pod-network: container hps-benchmark")
    assert FIX in message
    assert admit(switch_on_policies, job).admitted


def test_seed_example_without_host_network_is_denied(default_policies: list[Obj]) -> None:
    job = copy.deepcopy(load_example("hps-benchmark-job.yaml"))
    del job["spec"]["template"]["spec"]["hostNetwork"]
    assert FIX in admit(default_policies, job).denied[0]


def test_check_example_is_admitted(default_policies: list[Obj]) -> None:
    outcome = admit(default_policies, load_example("rdma-check-job.yaml"))
    assert outcome.admitted and not outcome.warnings, outcome


def test_objects_without_the_resource_are_never_evaluated(
        default_policies: list[Obj]) -> None:
    # The matchConditions leave them out before any validation runs, so no validation error
    # or cost limit can refuse them, whatever they hold.
    policy = next(o for o in default_policies
                  if o["metadata"]["name"] == "ack-rdma-dp-require-hostnetwork")
    names = [c["name"] for c in policy["spec"]["matchConditions"]]
    assert "asks-for-the-resource" in names
    broken = copy.deepcopy(policy)
    broken["spec"]["validations"] = [{"expression": "1 / 0 == 1", "message": "boom"}]
    with pytest.raises(PolicyError):
        failures(broken, pod(spec(ctr(limits=RDMA))))
    for obj in (pod(spec(ctr(limits={"cpu": "1"}))), pod(spec(ctr())),
                workload("CronJob", spec(ctr(limits={"nvidia.com/gpu": 1}))),
                workload("Deployment", spec(ctr(), init=[ctr("init")]))):
        assert failures(broken, obj) is None


def test_policy_ignores_kinds_outside_its_rules(default_policies: list[Obj]) -> None:
    policy = next(o for o in default_policies if o["kind"] == "ValidatingAdmissionPolicy")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert failures(policy, cm) is None



def test_match_conditions_never_fail_to_evaluate(default_policies: list[Obj]) -> None:
    # An error in a matchCondition would refuse the request under failurePolicy Fail, even
    # for an object the policy is not about: each condition must evaluate on every shape.
    shapes = [c[1] for c in CASES if c[1]["kind"] != "ConfigMap"]
    shapes += [non_compliant(kind) for kind in
               ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")]
    shapes.append(pod({"containers": [{"name": "bare", "image": "x"}]}))
    for policy in (o for o in default_policies if o["kind"] == "ValidatingAdmissionPolicy"):
        for condition in policy["spec"]["matchConditions"]:
            single = copy.deepcopy(policy)
            single["spec"]["matchConditions"] = [condition]
            for obj in shapes:
                failures(single, obj)
                if obj["kind"] != "Pod":
                    failures(single, obj, "UPDATE", old=obj)


RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"


def restarted(obj: Obj) -> None:
    """What `kubectl rollout restart` sends: an annotation on the pod template only."""
    template = obj["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[RESTARTED_AT] = (
        "2026-01-01T00:00:00Z")


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet"])
def test_a_rollout_restart_of_a_non_compliant_workload_is_refused_with_the_usual_message(
        default_policies: list[Obj], kind: str) -> None:
    old = non_compliant(kind)
    restart = updated(old, restarted)
    assert restart["spec"]["template"]["spec"] == old["spec"]["template"]["spec"]
    outcome = admit(default_policies, restart, "UPDATE", old=old)
    (message,) = outcome.denied
    # The same words as when the workload is created: the fix is the same.
    (created,) = admit(default_policies, old).denied
    assert message == created
    assert message.startswith(f"{kind} w: container trainer asks for rdma/hca but "
                              "spec.template.spec.hostNetwork is not true")
    assert FIX in message
    assert any(IPC in w for w in outcome.warnings)


def test_template_labels_count_as_a_template_change(default_policies: list[Obj]) -> None:
    old = non_compliant("Deployment")
    relabelled = updated(old, lambda o: o["spec"]["template"].setdefault(
        "metadata", {}).setdefault("labels", {}).__setitem__("version", "2"))
    assert not admit(default_policies, relabelled, "UPDATE", old=old).admitted


def test_a_cronjobs_job_template_metadata_change_is_judged(default_policies: list[Obj]) -> None:
    old = non_compliant("CronJob")
    new = updated(old, lambda o: o["spec"]["jobTemplate"]["spec"]["template"].setdefault(
        "metadata", {}).setdefault("annotations", {}).__setitem__(RESTARTED_AT, "now"))
    (message,) = admit(default_policies, new, "UPDATE", old=old).denied
    assert message.startswith("CronJob w: container trainer asks for rdma/hca")


def test_a_rollout_restart_of_a_compliant_workload_passes(default_policies: list[Obj]) -> None:
    old = workload("Deployment", spec(ctr("trainer", limits=RDMA, caps=LOCKED), host=True))
    outcome = admit(default_policies, updated(old, restarted), "UPDATE", old=old)
    assert outcome.admitted and not outcome.warnings


def test_a_restarted_workload_can_still_be_scaled_suspended_labelled_and_deleted(
        default_policies: list[Obj]) -> None:
    # A workload restarted before the policy existed carries the annotation already: the
    # operations that leave its template alone stay allowed.
    old = updated(non_compliant("Deployment"), restarted)
    for change in (lambda o: o["spec"].__setitem__("replicas", 0),
                   lambda o: o["spec"].__setitem__("paused", True),
                   lambda o: o["metadata"]["labels"].__setitem__("team", "infra")):
        outcome = admit(default_policies, updated(old, change), "UPDATE", old=old)
        assert outcome.admitted and not outcome.warnings, outcome
    job = updated(non_compliant("Job"), restarted)
    suspend = updated(job, lambda o: o["spec"].__setitem__("suspend", True))
    assert admit(default_policies, suspend, "UPDATE", old=job).admitted
    assert admit(default_policies, old, "DELETE").admitted


def test_with_the_switch_on_a_restart_is_never_refused(switch_on_policies: list[Obj]) -> None:
    old = non_compliant("Deployment")
    assert admit(switch_on_policies, updated(old, restarted), "UPDATE", old=old).admitted


POOLS = {"pools[0].resourceName": "rdma/hca", "pools[0].selectors.names": "{mlx5_0}",
         "pools[1].resourceName": "rdma/storage", "pools[1].mode": "exclusive",
         "pools[1].selectors.names": "{mlx5_bond_0}"}


@pytest.fixture(scope="module")
def pool_policies(render: RenderFn) -> list[Obj]:
    return [o for o in render(POOLS) if o["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize("name", ["rdma/hca", "rdma/storage"])
def test_with_pools_every_pools_resource_is_looked_for(pool_policies: list[Obj],
                                                       name: str) -> None:
    asking = {name: 1}
    (message,) = admit(pool_policies, pod(spec(ctr("trainer", limits=asking,
                                                   caps=LOCKED)))).denied
    assert message.startswith(f"Pod p: container trainer asks for {name} but "
                              "spec.hostNetwork is not true")
    outcome = admit(pool_policies, pod(spec(ctr("trainer", requests=asking), host=True)))
    assert outcome.admitted
    assert outcome.warnings == [f"Pod p: container trainer asks for {name} but lacks the "
                                "IPC_LOCK capability, so registering memory with the HCA "
                                "will fail: add IPC_LOCK to securityContext.capabilities.add"]


def test_with_pools_the_message_names_what_the_refused_container_asks_for(
        pool_policies: list[Obj]) -> None:
    both = pod(spec(ctr("a", limits={"cpu": 1}), ctr("b", limits={"rdma/storage": 1}),
                    host=False))
    (message,) = admit(pool_policies, both).denied
    assert message.startswith("Pod p: container b asks for rdma/storage but")
    static = {v["message"] for p in pool_policies if p["kind"] == "ValidatingAdmissionPolicy"
              for v in p["spec"]["validations"]}
    assert any(m.startswith("rdma/hca, rdma/storage (RDMA) works only in hostNetwork pods")
               for m in static), static


def test_with_pools_other_resources_are_never_evaluated(pool_policies: list[Obj]) -> None:
    outcome = admit(pool_policies, pod(spec(ctr(limits={"example.com/rdma": 1}))))
    assert outcome.admitted and not outcome.warnings
