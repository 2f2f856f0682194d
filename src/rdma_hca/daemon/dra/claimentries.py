"""The ``status.devices`` entries Prepare gives a claim, as KEP-4817 describes them: one per
allocated device of ours (driver, pool, device and the allocation's shareID), with a
``Ready`` condition and ``networkData``: the HCA's netdev (``interfaceName``), its MAC
(``hardwareAddress``) and its addresses (``ips``) where an address source is given: the
API wants them in CIDR form, and sysfs (where the RoCE GIDs are read) does not say an
address's prefix, so without one they are left out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.daemon.dra.claimrecords import Condition, DeviceEntry, NetworkData
from rdma_hca.daemon.dra.claims import Claim
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.model import Hca

log = logging.getLogger(__name__)

MAX_HARDWARE_ADDRESS = 128  # NetworkDeviceDataHardwareAddressMaxLength
MAX_INTERFACE_NAME = 256  # NetworkDeviceDataInterfaceNameMaxLength
MAX_IPS = 16  # NetworkDeviceDataMaxIPs


def read_mac(sysfs_root: str, netdev: str) -> str | None:
    """``<sysfs_root>/class/net/<netdev>/address``, or None when there is none."""
    try:
        with open(os.path.join(sysfs_root, "class", "net", netdev, "address")) as f:
            text = f.read(MAX_HARDWARE_ADDRESS + 1).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text and len(text) <= MAX_HARDWARE_ADDRESS else None


class EntryBuilder:
    """``await entries(claim, devices)``: the entries of ours the claim should carry."""

    def __init__(self, driver: str, *, sysfs_root: str, hca_of: Callable[[str], Hca | None],
                 files: OffLoop, ips_of: Callable[[str], Sequence[str]] | None,
                 now: Callable[[], datetime]) -> None:
        self.driver = driver
        self.sysfs_root = sysfs_root
        self.hca_of = hca_of  # device name -> the HCA behind it, from the current offer
        self.files = files
        self.ips_of = ips_of  # netdev -> its addresses in CIDR form (blocking: run off the loop)
        self._now = now

    async def entries(self, claim: Claim, devices: Sequence[PreparedDevice]
                      ) -> tuple[DeviceEntry, ...]:
        ours = {(d.pool, d.device): d for d in devices}
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%SZ")
        out: list[DeviceEntry] = []
        seen: set[tuple[str, ...]] = set()
        for r in claim.devices:
            prepared = ours.get((r.pool, r.device))
            if r.driver != self.driver or prepared is None:
                continue
            share_id = r.share_id or ""
            key = (r.pool, r.device, share_id)
            if key in seen:
                continue  # two requests got the same device: one entry
            seen.add(key)
            ready = Condition("Ready", "True", "Prepared",
                              f"HCA {prepared.hca} is ready in the pod", stamp,
                              claim.generation)
            out.append(DeviceEntry(self.driver, prepared.pool, prepared.device, share_id,
                                   (ready,), await self._network(prepared)))
        return tuple(out)

    async def _network(self, device: PreparedDevice) -> NetworkData | None:
        hca = self.hca_of(device.device)
        if hca is None or not hca.netdevs:
            return None
        netdev = hca.netdevs[0]
        try:
            mac = await self.files.run(f"MAC of {netdev}",
                                       lambda: read_mac(self.sysfs_root, netdev))
        except Exception as exc:  # a stuck sysfs read: the entry goes out without the MAC
            log.debug("cannot read the MAC of %s: %s", netdev, exc)
            mac = None
        ips: list[str] = []
        if self.ips_of is not None:
            ips_of = self.ips_of
            try:
                ips = await self.files.run(f"addresses of {netdev}", lambda: list(ips_of(netdev)))
            except Exception as exc:
                log.debug("cannot read the addresses of %s: %s", netdev, exc)
        return NetworkData(netdev[:MAX_INTERFACE_NAME], mac or "", tuple(ips[:MAX_IPS]))
