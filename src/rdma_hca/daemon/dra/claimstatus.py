"""Writing what Prepare gave a claim into its status, as KEP-4817 describes it:
``status.devices[]`` holds one entry per allocated device of ours (driver, pool, device and
the allocation's shareID), with a ``Ready`` condition and ``networkData``: the HCA's
netdev (``interfaceName``), its MAC (``hardwareAddress``) and its addresses (``ips``) where
an address source is given: the API wants them in CIDR form, and sysfs (where the RoCE GIDs
are read) does not say an address's prefix, so without one they are left out.

Entries of other drivers are never touched: each write is a read-modify-write of the
claim through its ``/status`` subresource with the resourceVersion just read, so a
concurrent writer makes it fail with 409 and it is done again on a fresh read.

Best effort: a claim whose status cannot be written is still prepared. Where the API
server does not take the field (the DRAResourceClaimDeviceStatus feature gate off: the
server drops it from what it stores) or refuses us (RBAC), that is said once in the log
and the writer stops trying, instead of retrying every claim.

The two coroutines, ``on_prepared(claim, devices)`` and ``on_unprepared(claim)``, are the
claims code's hooks.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from rdma_hca.daemon.dra.checkpoint import PreparedDevice
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kube.errors import KubeError
from rdma_hca.node.model import Hca

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
MAX_HARDWARE_ADDRESS = 128  # NetworkDeviceDataHardwareAddressMaxLength
MAX_INTERFACE_NAME = 256  # NetworkDeviceDataInterfaceNameMaxLength
MAX_IPS = 16  # NetworkDeviceDataMaxIPs


class ClaimStatusApi(Protocol):
    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def replace_claim_status(self, claim: dict[str, Any]) -> dict[str, Any]: ...


def read_mac(sysfs_root: str, netdev: str) -> str | None:
    """``<sysfs_root>/class/net/<netdev>/address``, or None when there is none."""
    try:
        with open(os.path.join(sysfs_root, "class", "net", netdev, "address")) as f:
            text = f.read(MAX_HARDWARE_ADDRESS + 1).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text and len(text) <= MAX_HARDWARE_ADDRESS else None


def _key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def _without_times(entries: Sequence[Mapping[str, Any]]) -> list[Any]:
    out = []
    for e in entries:
        conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                      for c in e.get("conditions") or []]
        out.append({**e, "conditions": conditions})
    return sorted(out, key=lambda e: str(_key(e)))


class ClaimStatusWriter:
    def __init__(self, api: ClaimStatusApi, driver: str, *, sysfs_root: str,
                 hca_of: Callable[[str], Hca | None], files: OffLoop,
                 ips_of: Callable[[str], Sequence[str]] | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api = api
        self.driver = driver
        self.sysfs_root = sysfs_root
        self.hca_of = hca_of  # device name -> the HCA behind it, from the current offer
        self.files = files
        self.ips_of = ips_of  # netdev -> its addresses in CIDR form (blocking: run off the loop)
        self._now = now
        self.disabled: str | None = None  # why the writer stopped, once it did
        self.writes = 0

    async def on_prepared(self, claim: ClaimRef, devices: Sequence[PreparedDevice],
                          known: Mapping[str, Any] | None = None) -> None:
        """Our entries of the claim's status.devices become those of ``devices``.

        ``known`` is the claim as Prepare read it: the write starts from it (its
        resourceVersion guards it), and only a conflict costs a fresh read.
        """
        if self.disabled is None and devices:
            await self._update(claim, devices, known)

    async def on_unprepared(self, claim: ClaimRef) -> None:
        """Our entries go; other drivers' stay."""
        if self.disabled is None:
            await self._update(claim, ())

    async def _entries(self, claim: dict[str, Any], devices: Sequence[PreparedDevice]
                       ) -> list[dict[str, Any]]:
        ours = {(d.pool, d.device): d for d in devices}
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}) \
            .get("results") or []
        generation = claim.get("metadata", {}).get("generation")
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%SZ")
        entries: list[dict[str, Any]] = []
        seen: set[tuple[Any, ...]] = set()
        for r in results:
            prepared = ours.get((r.get("pool"), r.get("device")))
            if r.get("driver") != self.driver or prepared is None:
                continue
            entry: dict[str, Any] = {"driver": self.driver, "pool": prepared.pool,
                                     "device": prepared.device}
            if r.get("shareID"):
                entry["shareID"] = r["shareID"]
            if _key(entry) in seen:
                continue  # two requests got the same device: one entry
            seen.add(_key(entry))
            condition: dict[str, Any] = {
                "type": "Ready", "status": "True", "reason": "Prepared",
                "message": f"HCA {prepared.hca} is ready in the pod",
                "lastTransitionTime": stamp}
            if isinstance(generation, int):
                condition["observedGeneration"] = generation
            entry["conditions"] = [condition]
            network = await self._network(prepared)
            if network:
                entry["networkData"] = network
            entries.append(entry)
        return entries

    async def _network(self, device: PreparedDevice) -> dict[str, Any]:
        hca = self.hca_of(device.device)
        if hca is None or not hca.netdevs:
            return {}
        netdev = hca.netdevs[0]
        out: dict[str, Any] = {"interfaceName": netdev[:MAX_INTERFACE_NAME]}
        try:
            mac = await self.files.run(f"MAC of {netdev}",
                                       lambda: read_mac(self.sysfs_root, netdev))
        except Exception as exc:  # a stuck sysfs read: the entry goes out without the MAC
            log.debug("cannot read the MAC of %s: %s", netdev, exc)
            mac = None
        if mac:
            out["hardwareAddress"] = mac
        if self.ips_of is not None:
            ips_of = self.ips_of
            try:
                ips = await self.files.run(f"addresses of {netdev}", lambda: list(ips_of(netdev)))
            except Exception as exc:
                log.debug("cannot read the addresses of %s: %s", netdev, exc)
                ips = []
            if ips:
                out["ips"] = ips[:MAX_IPS]
        return out

    async def _update(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                      known: Mapping[str, Any] | None = None) -> None:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        for _ in range(CONFLICT_RETRIES):
            try:
                claim = (copy.deepcopy(dict(known)) if known
                         else await self.api.get_claim(ref.namespace, ref.name))
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("cannot read %s to write its status: %s", where, exc)
                return
            known = None  # a conflict means it changed: read it again
            if claim.get("metadata", {}).get("uid") != ref.uid:
                return  # deleted and made again: not the claim we prepared
            status = claim.setdefault("status", {})
            current = list(status.get("devices") or [])
            others = [e for e in current if e.get("driver") != self.driver]
            mine = [e for e in current if e.get("driver") == self.driver]
            wanted = await self._entries(claim, devices)
            if _without_times(mine) == _without_times(wanted):
                return  # already there (a repeated Prepare): no write
            status["devices"] = others + wanted
            try:
                stored = await self.api.replace_claim_status(claim)
            except KubeError as exc:
                if exc.status == 409:
                    continue  # someone else wrote the claim: read it again
                if exc.status == 404:
                    return
                if exc.status in (403, 422, 405):
                    self._stop(f"the API server refuses the status of {where} ({exc}); "
                               "claims are prepared without status.devices from now on"
                               + (": grant update on resourceclaims/status and (1.36) "
                                  "associated-node:update on resourceclaims/driver"
                                  if exc.status == 403 else ""))
                    return
                log.warning("cannot write the status of %s: %s", where, exc)
                return
            self.writes += 1
            if wanted and not (stored.get("status") or {}).get("devices"):
                self._stop("the API server dropped status.devices (feature gate "
                           "DRAResourceClaimDeviceStatus off?); claims are prepared without "
                           "it from now on")
            return
        log.warning("the status of %s kept changing under us; left as it is", where)

    def _stop(self, why: str) -> None:
        self.disabled = why
        log.warning("%s", why)
