"""What the API server does with a ValidatingAdmissionPolicy, done with `celpy`.

Only the parts our chart uses: `matchConstraints.resourceRules` (group, version, resource,
operation), `matchConditions`, `variables` (each one sees the ones before it), and
`validations` with `message`/`messageExpression`, then the binding's `validationActions`.
The expressions are taken from the rendered chart, so what is tested is what is installed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

# kind -> (API group, version, resource), for the kinds the tests submit.
KINDS: dict[str, tuple[str, str, str]] = {
    "Pod": ("", "v1", "pods"),
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "DaemonSet": ("apps", "v1", "daemonsets"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "Job": ("batch", "v1", "jobs"),
    "CronJob": ("batch", "v1", "cronjobs"),
    "ConfigMap": ("", "v1", "configmaps"),
    "ResourceClaim": ("resource.k8s.io", "v1", "resourceclaims"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    "DeviceClass": ("resource.k8s.io", "v1", "deviceclasses"),
    "Node": ("", "v1", "nodes"),
}

_ENV = celpy.Environment()


class PolicyError(AssertionError):
    """An expression failed to evaluate or returned a non-boolean; with failurePolicy Fail
    the API server would refuse every matching object, so tests must treat it as a bug."""


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> celpy.Runner:
    return _ENV.program(_ENV.compile(expression))


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    try:
        return _program(expression).evaluate(dict(activation))
    except CELEvalError as err:
        raise PolicyError(f"CEL error in {expression!r}: {err.args[0]}") from err


def _bool(expression: str, activation: Mapping[str, Any]) -> bool:
    value = _evaluate(expression, activation)
    if not isinstance(value, celtypes.BoolType):
        raise PolicyError(f"{expression!r} returned {value!r}, not a bool")
    return bool(value)


def _rule_matches(rule: Mapping[str, Any], kind: str, operation: str) -> bool:
    group, version, resource = KINDS[kind]
    return (
        operation in rule["operations"] or "*" in rule["operations"]
    ) and all(
        wanted in rule[key] or "*" in rule[key]
        for key, wanted in (("apiGroups", group), ("apiVersions", version),
                            ("resources", resource))
    )


def _request(obj: Mapping[str, Any], operation: str,
             user: Mapping[str, Any] | None = None) -> dict[str, Any]:
    group, version, resource = KINDS[obj["kind"]]
    meta = obj.get("metadata", {})
    return {
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": resource},
        "operation": operation,
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "default"),
        "userInfo": dict(user or {"username": "kubernetes-admin"}),
    }


@dataclass
class Outcome:
    """What a client sees: refusal messages (Deny) and warnings (Warn)."""

    denied: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return not self.denied


def failures(policy: Mapping[str, Any], obj: Mapping[str, Any],
             operation: str = "CREATE", old: Mapping[str, Any] | None = None,
             user: Mapping[str, Any] | None = None) -> list[str] | None:
    """Messages of the policy's failed validations, or None when the policy does not apply.

    ``old`` is the stored object an UPDATE replaces (CEL's ``oldObject``), as the API server
    always has one for an UPDATE and never for a CREATE. ``user`` is the request's
    ``userInfo`` (username, extra); by default a cluster administrator.
    """
    if (operation == "UPDATE") != (old is not None):
        raise ValueError("an UPDATE needs the old object, and only an UPDATE has one")
    spec = policy["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(_rule_matches(rule, obj["kind"], operation) for rule in rules):
        return None
    activation: dict[str, Any] = {
        "object": json_to_cel(dict(obj)),
        "oldObject": json_to_cel(dict(old)) if old is not None else None,
        "request": json_to_cel(_request(obj, operation, user)),
    }
    # As the API server does: any false condition skips the policy; an error counts only
    # when no condition is false (and then, with failurePolicy Fail, refuses the request).
    errors: list[PolicyError] = []
    for condition in spec.get("matchConditions", []):
        try:
            if not _bool(condition["expression"], activation):
                return None
        except PolicyError as err:
            errors.append(err)
    if errors:
        raise errors[0]
    variables: dict[celtypes.StringType, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = _evaluate(
            variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    messages: list[str] = []
    for validation in spec["validations"]:
        if _bool(validation["expression"], activation):
            continue
        if "messageExpression" in validation:
            messages.append(str(_evaluate(validation["messageExpression"], activation)))
        else:
            messages.append(validation.get("message", "failed expression"))
    return messages


def admit(objects: Iterable[Mapping[str, Any]], obj: Mapping[str, Any],
          operation: str = "CREATE", old: Mapping[str, Any] | None = None,
          user: Mapping[str, Any] | None = None) -> Outcome:
    """Run every policy of the rendered chart that a binding enables, as the API server would."""
    objects = list(objects)
    policies = {o["metadata"]["name"]: o for o in objects
                if o["kind"] == "ValidatingAdmissionPolicy"}
    outcome = Outcome()
    for binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        spec = binding["spec"]
        assert "matchResources" not in spec and "paramRef" not in spec, "not emulated"
        messages = failures(policies[spec["policyName"]], obj, operation, old, user) or []
        if "Deny" in spec["validationActions"]:
            outcome.denied += messages
        if "Warn" in spec["validationActions"]:
            outcome.warnings += messages
    return outcome


# --- DeviceClass selectors -----------------------------------------------------------------
# The same engine evaluates the CEL of the chart's DeviceClasses as the scheduler's DRA
# allocator does (k8s.io/dynamic-resource-allocation/cel): `device.driver`,
# `device.allowMultipleAllocations`, `device.attributes[<domain>].<id>` and
# `device.capacity[<domain>].<id>` (here as text), a name without a domain being the
# driver's. An unknown domain is an empty map; an unknown id is an error, which aborts the
# allocation (a selector that errs on some device is a bug: PolicyError).

_ATTRIBUTE_KINDS = ("string", "int", "bool", "version")


class _Domains(celtypes.MapType):
    """Domain -> its attributes; a domain no attribute has is an empty map, as upstream."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def _by_domain(entries: Mapping[str, Any], driver: str, convert: Any) -> _Domains:
    domains: dict[str, dict[str, Any]] = {}
    for name, value in entries.items():
        domain, _, ident = name.rpartition("/")
        domains.setdefault(domain or driver, {})[ident] = convert(value)
    return _Domains({celtypes.StringType(k): json_to_cel(v) for k, v in domains.items()})


def _attribute(value: Mapping[str, Any]) -> Any:
    (kind,) = [k for k in _ATTRIBUTE_KINDS if k in value]
    return value[kind]


def device_selected(expression: str, driver: str, device: Mapping[str, Any]) -> bool:
    """Whether a DeviceClass selector picks ``device`` (as a ResourceSlice holds it)."""
    cel_device = celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(driver),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
            bool(device.get("allowMultipleAllocations"))),
        celtypes.StringType("attributes"): _by_domain(device.get("attributes") or {},
                                                      driver, _attribute),
        celtypes.StringType("capacity"): _by_domain(device.get("capacity") or {}, driver,
                                                    lambda c: str(c.get("value"))),
    })
    return _bool(expression, {"device": cel_device})
