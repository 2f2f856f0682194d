"""Device metadata (KEP-5304): one file per claim and request, mounted into its containers.

The layout and the format are the ones the upstream kubelet plugin helper writes
(``k8s.io/dynamic-resource-allocation/api/metadata``), so a workload reads ours as it
reads any other driver's:

- on the host, ``<plugin dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json``;
- in the container, ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/
  <request>/<driver>-metadata.json`` for a claim the pod names, and ``resourceclaimtemplates/
  <pod claim name>/...`` for one made from a template (the claim's
  ``resource.kubernetes.io/pod-claim-name`` annotation);
- the file is a stream of ``DeviceMetadata`` objects (``metadata.resource.k8s.io``), the
  same content once per version, newest first: a reader takes the first it knows.

A prioritized list's subrequest (``<request>/<subrequest>``) is filed and named as its
request, the name a container's ``resources.claims[].request`` gives and the kubelet
matches (the claim's prepared devices carry request names so). Each device carries the
attributes its ResourceSlice publishes, its RoCE v2 GIDs with their address family, and
the env the claim's CDI spec sets. The files are bound
through the claim's own CDI spec: each HCA's CDI device mounts the files of its requests,
so a container sees the files of the requests it uses (two HCAs of one request mount the
same file: CDI keeps one mount per container path). Building is pure; ``write``, ``undo``
and ``remove`` block (the driver runs them off the loop).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from rdma_hca.contract.checkpoint import PreparedClaim
from rdma_hca.contract.dra import request_name
from rdma_hca.daemon.dra.devices import Attributes, attributes, node_attributes
from rdma_hca.kit.files import write_atomic
from rdma_hca.node.model import GidKind, Hca
from rdma_hca.settings.model import DeviceMetadata

GROUP = "metadata.resource.k8s.io"
KIND = "DeviceMetadata"
HOST_SUBDIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
GENERATION = 1  # written once at Prepare, never updated
# The attributes this driver adds to the published ones (the names are the driver's own).
ROCE_GIDS = "roceV2GIDs"
CONTAINER_ENV = "containerEnv"

_FAMILY = {GidKind.IPV4_MAPPED: "inet", GidKind.GLOBAL_IPV6: "inet6",
           GidKind.LINK_LOCAL: "inet6"}
# What a name becomes a path segment through: a Kubernetes name (DNS subdomain or label).
_SEGMENT = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def versions(setting: DeviceMetadata) -> tuple[str, ...]:
    """The versions a file holds, newest first; none when the setting is off."""
    if setting is DeviceMetadata.V1BETA1:
        return ("v1beta1", "v1alpha1")
    if setting is DeviceMetadata.V1ALPHA1:
        return ("v1alpha1",)
    return ()


def _segment(name: str, what: str) -> str:
    if not _SEGMENT.fullmatch(name) or len(name) > 253:
        raise ValueError(f"{what} {name!r} is not a Kubernetes name")
    return name


def base_request(request: str) -> str:
    """The request a subrequest belongs to: files are per request."""
    return request_name(request)


def claim_dir(plugin_dir: str, namespace: str, name: str) -> str:
    return os.path.join(plugin_dir, HOST_SUBDIR, f"{_segment(namespace, 'namespace')}_"
                        f"{_segment(name, 'claim name')}")


def host_path(plugin_dir: str, namespace: str, name: str, request: str) -> str:
    return os.path.join(claim_dir(plugin_dir, namespace, name),
                        _segment(base_request(request), "request"), HOST_FILE)


def container_path(driver: str, name: str, pod_claim_name: str | None, request: str) -> str:
    where = (os.path.join(TEMPLATES_SUBDIR, _segment(pod_claim_name, "pod claim name"))
             if pod_claim_name else os.path.join(CLAIMS_SUBDIR, _segment(name, "claim name")))
    return os.path.join(CONTAINER_DIR, where, _segment(base_request(request), "request"),
                        f"{driver}-metadata.json")


def pod_claim_name(source: Mapping[str, Any]) -> str | None:
    """The name the pod gives a claim made from its template; None for a named claim."""
    meta = source.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    value = notes.get(POD_CLAIM_ANNOTATION) if isinstance(notes, Mapping) else None
    return value if isinstance(value, str) and value else None


def roce_gids(hca: Hca) -> list[str]:
    """``<port>:<index>:<family>:<gid>`` for every RoCE v2 GID (the GID last: it has colons)."""
    return [f"{p.number}:{g.index}:{_FAMILY[g.kind]}:{g.address}"
            for p in hca.ports for g in p.gids
            if g.is_roce_v2 and g.kind in _FAMILY]


def device_attributes(hca: Hca, driver: str, env: Sequence[str]) -> Attributes:
    """What the slice publishes of the device, its RoCE v2 GIDs and the container env."""
    attrs = attributes(hca, driver)
    gids = roce_gids(hca)
    if gids:
        attrs[f"{driver}/{ROCE_GIDS}"] = {"strings": gids}
    if env:
        attrs[f"{driver}/{CONTAINER_ENV}"] = {"strings": list(env)}
    return attrs


def group_attributes(hcas: Sequence[Hca], driver: str,
                     env: Sequence[str]) -> Attributes:
    """The node-wide device's: what the slice publishes of it, and the container env
    (which names its HCAs); the GIDs of many HCAs are each HCA's own device's."""
    attrs = node_attributes(hcas, driver)
    if env:
        attrs[f"{driver}/{CONTAINER_ENV}"] = {"strings": list(env)}
    return attrs


class MetadataDevice(TypedDict):
    """One device of a request in a ``DeviceMetadata`` object."""

    driver: str
    pool: str
    name: str
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class MetadataFile:
    host_path: str
    container_path: str
    content: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What a claim's Prepare writes: the files, and each CDI device's mounts (by device)."""

    claim_dir: str = ""
    files: tuple[MetadataFile, ...] = ()
    mounts: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


NOTHING = Plan()


def document(version: str, claim: PreparedClaim, uid: str, pod_claim: str | None,
             request: str, devices: Sequence[MetadataDevice]) -> dict[str, Any]:
    """One ``DeviceMetadata`` object, as the upstream scheme encodes it."""
    doc: dict[str, Any] = {
        "kind": KIND, "apiVersion": f"{GROUP}/{version}",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": uid,
                     "generation": GENERATION}}
    if pod_claim:
        doc["podClaimName"] = pod_claim
    doc["requests"] = [{"name": request, "devices": [dict(d) for d in devices]}]
    return doc


def plan(setting: DeviceMetadata, driver: str, plugin_dir: str, uid: str,
         claim: PreparedClaim, hcas: Mapping[str, Sequence[Hca]],
         env: Mapping[str, Sequence[str]], pod_claim: str | None,
         groups: Collection[str] = ()) -> Plan:
    """The files of every request of ``claim`` (``hcas`` and ``env`` by device; ``groups``
    names the devices that stand for several HCAs), or nothing when off."""
    wanted = versions(setting)
    if not wanted:
        return NOTHING
    by_request: dict[str, list[MetadataDevice]] = {}
    for d in claim.devices:
        attrs = (group_attributes(hcas[d.device], driver, env[d.device]) if d.device in groups
                 else device_attributes(hcas[d.device][0], driver, env[d.device]))
        entry: MetadataDevice = {"driver": driver, "pool": d.pool, "name": d.device,
                                 "attributes": attrs}
        for request in d.request_names:
            by_request.setdefault(request, []).append(entry)
    files: list[MetadataFile] = []
    paths: dict[str, tuple[str, str]] = {}
    for request, devices in by_request.items():
        host = host_path(plugin_dir, claim.namespace, claim.name, request)
        inside = container_path(driver, claim.name, pod_claim, request)
        content = "".join(
            json.dumps(document(v, claim, uid, pod_claim, request, devices), indent=2) + "\n"
            for v in wanted)
        files.append(MetadataFile(host, inside, content))
        paths[request] = (host, inside)
    mounts = {d.device: tuple(dict.fromkeys(paths[r] for r in d.request_names))
              for d in claim.devices}
    return Plan(claim_dir(plugin_dir, claim.namespace, claim.name), tuple(files), mounts)


def write(p: Plan) -> None:
    """Write every file of the plan; on a failure none of them is left behind."""
    try:
        for f in p.files:
            write_atomic(f.host_path, f.content, mode=0o644)
    except BaseException:
        undo(p)
        raise


def undo(p: Plan) -> None:
    """Remove what :func:`write` wrote of the plan (a Prepare that failed later)."""
    for f in p.files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.host_path)
        with contextlib.suppress(OSError):  # only when empty
            os.rmdir(os.path.dirname(f.host_path))
    if p.claim_dir:
        with contextlib.suppress(OSError):
            os.rmdir(p.claim_dir)


def _uids(path: str) -> set[str]:
    """The claim UIDs the files under a claim's directory were written for."""
    found: set[str] = set()
    for top, _, names in os.walk(path):
        for n in names:
            try:
                with open(os.path.join(top, n), encoding="utf-8") as f:
                    first, _ = json.JSONDecoder().raw_decode(f.read())
                found.add(str(first["metadata"]["uid"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return found


def remove(plugin_dir: str, namespace: str, name: str, uid: str) -> None:
    """Remove a claim's files, whether or not it had any (Unprepare is idempotent).

    The directory is named after the claim, not its UID: when it holds the files of a
    claim of the same name made since (another UID), they stay.
    """
    try:
        path = claim_dir(plugin_dir, namespace, name)
    except ValueError:
        return  # not a name a file was ever written under
    if not os.path.isdir(path) or _uids(path) - {uid}:
        return
    import shutil  # here only: it brings the compression modules, which nothing else needs

    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def written_pod_claim(plugin_dir: str, claim: PreparedClaim) -> str | None:
    """The pod claim name a claim's files were written with (its spec is rebuilt from
    them after a reboot, when only the checkpoint is left to say what the claim was)."""
    for d in claim.devices:
        for request in d.request_names:
            try:
                with open(host_path(plugin_dir, claim.namespace, claim.name, request),
                          encoding="utf-8") as f:
                    first, _ = json.JSONDecoder().raw_decode(f.read())
            except (OSError, ValueError):
                continue
            value = first.get("podClaimName") if isinstance(first, dict) else None
            return value if isinstance(value, str) and value else None
    return None
