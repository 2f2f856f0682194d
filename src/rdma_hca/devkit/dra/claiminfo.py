"""What the kubelet keeps of each prepared claim, and which CDI devices a container gets.

As the 1.36 kubelet's DRA manager (``pkg/kubelet/cm/dra``): a NodePrepareResources
answer is stored per claim (namespace and name) and driver, each device with the request
names the driver answered, as answered. A container gets, for each ``resources.claims[]``
entry that names one of the pod's claims, the CDI devices of that claim: all of them when
the entry names no ``request``, else only those whose request names contain it exactly
(or that name none). So a driver that answers a prioritized list's ``hca/any`` where the
container names ``hca`` leaves that container without the device, as seen on a real
cluster. A claim the scheduler made for a container's extended resource is matched by
the request its ``requestMappings`` give that container.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredDevice:
    """One device of a driver's answer, as the kubelet stores it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None  # None when the answer had none (field unset)


@dataclass
class ClaimInfo:
    namespace: str
    name: str
    uid: str
    devices: dict[str, list[StoredDevice]] = field(default_factory=dict)  # by driver

    def cdi_devices(self, request: str = "") -> list[str]:
        """The CDI IDs a container naming ``request`` of this claim (or the whole claim:
        "") gets."""
        return [i for ds in self.devices.values() for d in ds
                if not request or not d.request_names or request in d.request_names
                for i in d.cdi_ids]


class ClaimInfoCache:
    """The kubelet's claim info cache: filled by Prepare answers, emptied by Unprepare."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimInfo] = {}

    def prepared(self, driver: str, claim: tuple[str, str, str], answer: Any) -> None:
        """Store one claim's ``NodePrepareResourceResponse`` (an answer with an error is
        not stored: the kubelet retries it)."""
        namespace, uid, name = claim
        if answer.error:
            return
        info = self.claims.setdefault((namespace, name), ClaimInfo(namespace, name, uid))
        info.devices[driver] = [
            StoredDevice(tuple(d.request_names), d.pool_name, d.device_name,
                         tuple(d.cdi_device_ids),
                         d.share_id if "share_id" in d.DESCRIPTOR.fields_by_name
                         and d.HasField("share_id") else None)
            for d in answer.devices]

    def by_uid(self, uid: str) -> ClaimInfo | None:
        return next((c for c in self.claims.values() if c.uid == uid), None)

    def unprepared(self, driver: str, claim: tuple[str, str, str]) -> None:
        namespace, _, name = claim
        info = self.claims.get((namespace, name))
        if info is None:
            return
        info.devices.pop(driver, None)
        if not info.devices:
            del self.claims[(namespace, name)]

    def container_devices(self, pod: Mapping[str, Any], container: str) -> list[str]:
        """The CDI IDs the named container of ``pod`` (a Pod object) is started with.

        A claim of the pod that is not prepared is an error, as in the kubelet (which
        never starts a container before its claims are prepared)."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        namespace = (pod.get("metadata") or {}).get("namespace", "")
        found = [c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
                 if c.get("name") == container]
        if not found:
            raise LookupError(f"pod has no container {container!r}")
        names = {s.get("name"): s.get("resourceClaimName")
                 for s in status.get("resourceClaimStatuses") or []}
        out: list[str] = []
        for pod_claim in spec.get("resourceClaims") or []:
            claim_name = pod_claim.get("resourceClaimName") or names.get(pod_claim.get("name"))
            if claim_name is None:
                continue  # no claim was made for it: nothing to give
            for entry in (found[0].get("resources") or {}).get("claims") or []:
                if entry.get("name") == pod_claim.get("name"):
                    out += self._info(namespace, claim_name).cdi_devices(
                        entry.get("request") or "")
        extended = status.get("extendedResourceClaimStatus")
        if extended:
            info = self._info(namespace, extended["resourceClaimName"])
            for mapping in extended.get("requestMappings") or []:
                if mapping.get("containerName") == container:
                    out += info.cdi_devices(mapping["requestName"])
        return out

    def _info(self, namespace: str, name: str) -> ClaimInfo:
        info = self.claims.get((namespace, name))
        if info is None:
            raise LookupError(f"unable to get claim info for ResourceClaim {name} in "
                              f"namespace {namespace}")
        return info


def pod(namespace: str, name: str, claims: Mapping[str, str],
        containers: Mapping[str, Sequence[tuple[str, str]]]) -> dict[str, Any]:
    """A Pod as the kubelet sees it once its claims exist: ``claims`` maps each pod claim
    name to its ResourceClaim's name; ``containers`` each container's
    ``resources.claims`` entries as (pod claim name, request or "")."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "resourceClaims": [{"name": c, "resourceClaimTemplateName": f"{c}-template"}
                               for c in claims],
            "containers": [{"name": c, "resources": {"claims": [
                {"name": n, **({"request": r} if r else {})} for n, r in entries]}}
                for c, entries in containers.items()]},
        "status": {"resourceClaimStatuses": [{"name": c, "resourceClaimName": n}
                                             for c, n in claims.items()]},
    }
