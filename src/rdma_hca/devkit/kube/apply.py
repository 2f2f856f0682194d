"""Server-side apply of a ResourceClaim's ``status.devices``, as the real API server does it
for the part our code touches.

``status.devices`` is a list-map (``+listType=map``, keys driver, pool, device, shareID).
Each field manager owns the entries it applied, recorded in ``metadata.managedFields`` as
the real server records them (``operation: Apply``, ``subresource: status``, the entries'
keys under ``f:status`` / ``f:devices``). An apply:

- sets the entries it holds (a new key is appended; a known key is replaced, its position
  kept);
- removes the entries this manager applied before and leaves out now, unless another
  manager owns them too (then only this manager's ownership goes);
- keeps every entry another manager owns;
- answers 409 when it changes an entry another manager owns, unless ``force=true`` (then
  the entry changes hands);
- changes nothing but ``status.devices`` through the status subresource (spec and
  metadata of the body are ignored, as the status strategy resets them), and bumps the
  resourceVersion only when the object changed;
- drops ``status.devices`` when the DRAResourceClaimDeviceStatus feature gate is off (the
  stored object comes back without the entries, the write succeeds);
- validates the result as a PUT of the status is validated.

Entries written by a PUT (an update, not an apply) are owned by no manager here: an apply
keeps them, and may replace one of the same key.

UIDs as upstream's patch handler treats them: a body naming a UID for an object that does
not exist answers 409 ("uid mismatch"), one naming another UID than the object's 422
(``metadata.uid`` is immutable); without a UID an absent object is 404 (the status
subresource never creates).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from rdma_hca.devkit.kube import validation
from rdma_hca.devkit.kube.errors import HttpError
from rdma_hca.devkit.kube.validation import Invalid

APPLY_PATCH = "application/apply-patch+yaml"
MAX_MANAGER = 128  # FieldManagerMaxLength
KEYS = ("driver", "pool", "device", "shareID")

Key = tuple[str, ...]


def key_of(entry: Mapping[str, Any]) -> Key:
    return tuple(str(entry.get(k) or "") for k in KEYS)


def _field_key(key: Key) -> str:
    """``k:{"device":...,"driver":...,"pool":...}``: a list-map key as managedFields write it."""
    return "k:" + json.dumps({k: v for k, v in zip(KEYS, key, strict=True) if v},
                             sort_keys=True, separators=(",", ":"))


def _key_of_field(text: str) -> Key:
    raw = json.loads(text[2:])
    return tuple(str(raw.get(k) or "") for k in KEYS)


def owned(obj: Mapping[str, Any]) -> dict[str, set[Key]]:
    """The entries each manager applied through the status subresource."""
    out: dict[str, set[Key]] = {}
    for mf in (obj.get("metadata") or {}).get("managedFields") or []:
        if mf.get("operation") != "Apply" or mf.get("subresource") != "status":
            continue
        devices = ((mf.get("fieldsV1") or {}).get("f:status") or {}).get("f:devices") or {}
        out[mf["manager"]] = {_key_of_field(k) for k in devices if k.startswith("k:")}
    return out


def _set_owned(meta: dict[str, Any], owners: Mapping[str, set[Key]], api_version: str,
               stamp: str, changed: set[str]) -> None:
    kept = [mf for mf in meta.get("managedFields") or []
            if not (mf.get("operation") == "Apply" and mf.get("subresource") == "status")]
    before = {mf["manager"]: mf for mf in meta.get("managedFields") or []
              if mf.get("operation") == "Apply" and mf.get("subresource") == "status"}
    for manager, keys in owners.items():
        if not keys:
            continue  # a manager that owns nothing any more leaves managedFields
        entry = before.get(manager) or {}
        kept.append({
            "manager": manager, "operation": "Apply",
            "apiVersion": api_version or entry.get("apiVersion", ""),
            "time": stamp if manager in changed or not entry else entry.get("time", stamp),
            "fieldsType": "FieldsV1", "subresource": "status",
            "fieldsV1": {"f:status": {"f:devices": {
                _field_key(k): {".": {}} for k in sorted(keys)}}}})
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)


def prune(obj: dict[str, Any]) -> None:
    """After an update (a PUT) of the status: no manager owns an entry that is gone."""
    present = {key_of(e) for e in (obj.get("status") or {}).get("devices") or []}
    owners = {m: keys & present for m, keys in owned(obj).items()}
    _set_owned(obj["metadata"], owners, "", "", set())


def check_body(body: Mapping[str, Any] | None, name: str, ns: str, kind: str,
               api_version: str) -> None:
    if body is None:
        raise HttpError(400, "BadRequest", "the body of an apply patch is required")
    if not body.get("apiVersion") or not body.get("kind"):
        raise HttpError(400, "BadRequest", "error decoding YAML: Object 'Kind' is missing "
                        "or apiVersion is not set: an apply patch is a whole object")
    if body["kind"] != kind or body["apiVersion"] != api_version:
        raise HttpError(400, "BadRequest", f"the body is a {body['kind']} of "
                        f"{body['apiVersion']}, not a {kind} of {api_version}")
    meta = body.get("metadata") or {}
    if meta.get("name") != name:
        raise HttpError(400, "BadRequest", f"the name of the object ({meta.get('name')}) "
                        f"does not match the name on the URL ({name})")
    if meta.get("namespace", ns) != ns:
        raise HttpError(400, "BadRequest", "the namespace of the provided object does not "
                        "match the namespace sent on the request")


def with_manager(method: str, query: dict[str, list[str]], content_type: str,
                 user_agent: str) -> dict[str, list[str]]:
    """The query of a create, update or merge patch with its field manager, as the API
    server names it: the fieldManager given, else the User-Agent's product (the part
    before its first ``/``). An apply names its own (:func:`check_options`)."""
    if method not in ("POST", "PUT", "PATCH") or content_type.startswith(APPLY_PATCH) \
            or "fieldManager" in query:
        return query
    return {**query, "fieldManager": [user_agent.split("/", 1)[0]]}


def check_manager(query: Mapping[str, list[str]]) -> str:
    """The field manager of a write: at most 128 printable characters, as upstream checks."""
    manager = (query.get("fieldManager") or [""])[0]
    if len(manager) > MAX_MANAGER:
        raise Invalid(f"fieldManager: Too long: may not be more than {MAX_MANAGER} bytes")
    if not manager.isprintable():
        raise Invalid(f"fieldManager: Invalid value: {manager!r}: must only contain "
                      "printable characters")
    return manager


def record_update(obj: dict[str, Any], manager: str, api_version: str, stamp: str,
                  subresource: str = "") -> None:
    """``manager``'s Update entry in ``obj``'s managedFields, replacing its earlier one
    (one entry per manager, operation and subresource, as upstream keeps them). Which
    fields it set is kept coarse: the top-level fields it wrote."""
    if not manager:
        return
    meta = obj.setdefault("metadata", {})
    fields = sorted(k for k in obj if k not in ("apiVersion", "kind", "metadata"))
    if subresource:
        fields = ["status"]
    entry: dict[str, Any] = {
        "manager": manager, "operation": "Update", "apiVersion": api_version, "time": stamp,
        "fieldsType": "FieldsV1", "fieldsV1": {f"f:{k}": {} for k in fields}}
    if subresource:
        entry["subresource"] = subresource
    kept = [mf for mf in meta.get("managedFields") or []
            if not (mf.get("manager") == manager and mf.get("operation") == "Update"
                    and mf.get("subresource", "") == subresource)]
    meta["managedFields"] = [*kept, entry]


def check_options(query: Mapping[str, list[str]]) -> tuple[str, bool]:
    manager = (query.get("fieldManager") or [""])[0]
    if not manager:
        raise Invalid("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required "
                      "value: is required for apply patch")
    if len(manager) > MAX_MANAGER:
        raise Invalid(f"fieldManager: Too long: may not be more than {MAX_MANAGER} bytes")
    force = (query.get("force") or ["false"])[0]
    if force not in ("true", "false"):
        raise HttpError(400, "BadRequest", f"force: {force!r} is not a boolean")
    return manager, force == "true"


def apply_status(old: dict[str, Any], body: Mapping[str, Any], manager: str, force: bool,
                 *, gate_on: bool, api_version: str, stamp: str) -> dict[str, Any]:
    """The claim ``old`` after ``manager`` applied ``body``'s ``status.devices``."""
    uid = (body.get("metadata") or {}).get("uid")
    if uid and uid != old["metadata"]["uid"]:
        raise Invalid(f'metadata.uid: Invalid value: "{uid}": field is immutable')
    status = body.get("status") or {}
    if not isinstance(status, dict) or set(status) - {"devices"}:
        raise HttpError(400, "BadRequest", "the fake API server applies status.devices "
                        "only; leave the other status fields out of the apply")
    applied = status.get("devices") or []
    if not isinstance(applied, list) or not all(isinstance(e, dict) for e in applied):
        raise Invalid("status.devices: Invalid value: a list of objects is required")
    new = copy.deepcopy(old)
    if not gate_on:
        return new  # dropDisabledFields: the write succeeds, the entries are not kept
    keys = [key_of(e) for e in applied]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise Invalid(f"status.devices: Duplicate value: {dup!r}")
    owners = owned(old)
    mine = owners.get(manager, set())
    current: list[dict[str, Any]] = list((old.get("status") or {}).get("devices") or [])
    by_key = {key_of(e): e for e in current}
    conflicts = [(k, other) for k, e in zip(keys, applied, strict=True)
                 for other, theirs in owners.items()
                 if other != manager and k in theirs and by_key.get(k) != e]
    if conflicts and not force:
        lines = "; ".join(f'conflict with "{other}": .status.devices[{_field_key(k)[2:]}]'
                          for k, other in conflicts)
        raise HttpError(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): "
                        f"{lines}")
    for k, other in conflicts:  # forced: the entry changes hands
        owners[other].discard(k)
    others: set[Key] = set().union(*(v for m, v in owners.items() if m != manager))
    gone = {k for k in mine - set(keys) if k not in others}
    merged = [next(e for e in applied if key_of(e) == key_of(c)) if key_of(c) in keys
              else c for c in current if key_of(c) not in gone]
    merged += [e for e in applied if key_of(e) not in by_key]
    new_status = {**(new.get("status") or {}), "devices": copy.deepcopy(merged)}
    if not merged:
        new_status.pop("devices")
    validation.check_claim_status(old, new_status)
    new["status"] = new_status
    owners[manager] = set(keys)
    _set_owned(new["metadata"], owners, api_version, stamp,
               {manager} if new_status != (old.get("status") or {}) or mine != set(keys)
               else set())
    return new
