"""DeviceClasses that trap users: they select the driver but not the kind of device.

Every DRA guide writes a class as ``device.driver == "<driver>"``. In shared mode the
driver publishes, beside one device per HCA (``kind: hca``), the node-wide device
``all-hcas`` (``kind: node``) that gives a pod every usable HCA, as ``rdma/hca: 1`` does.
A class that does not select on ``kind`` matches both, so:

- a claim asking for "an HCA" of that class may be given the whole node;
- a selector naming an attribute only HCAs carry (``netdev``, ``pcieRoot``, ...) fails
  allocation for every claim of the class, with "CEL runtime error: no such key" when
  the scheduler evaluates it on the node-wide device.

Judged here as a pure function of the classes and slices the API server listed. The
chart's classes select on ``kind`` and never trap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rdma_hca.contract.dra import HCA_ONLY_ATTRIBUTES, KIND, NODE_DEVICE, hca_selector
from rdma_hca.tools.doctor.draobjects import DeviceClass
from rdma_hca.tools.doctor.result import Check

TITLE = "DeviceClasses of {driver}"


def _quoted(driver: str) -> str:
    return rf"""(?:"{re.escape(driver)}"|'{re.escape(driver)}')"""


def _attributes(driver: str) -> str:
    """CEL naming the driver's attributes: ``device.attributes["<driver>"]``."""
    return rf"device\.attributes\s*\[\s*{_quoted(driver)}\s*\]"


def selects_kind(device_class: DeviceClass, driver: str) -> bool:
    """Whether a selector of the class reads the driver's ``kind`` attribute (as
    ``.kind``, ``["kind"]`` or ``"kind" in ...``)."""
    attrs = _attributes(driver)
    kind = re.escape(KIND)
    pattern = re.compile(
        rf"{attrs}\s*(?:\.\s*{kind}\b|\[\s*[\"']{kind}[\"']\s*\])"
        rf"|[\"']{kind}[\"']\s+in\s+{attrs}")
    return any(pattern.search(e) for e in device_class.expressions)


# ``device.attributes["<domain>"].<name>`` or ``device.attributes["<domain>"]["<name>"]``.
_NAMED = re.compile(r"device\.attributes\s*\[\s*[\"']([^\"']+)[\"']\s*\]\s*"
                    r"(?:\.\s*(\w+)|\[\s*[\"'](\w+)[\"']\s*\])")


def hca_only_attributes(device_class: DeviceClass, driver: str) -> list[str]:
    """The attributes only per-HCA devices carry that the class's selectors name (the
    ones allocation fails on when the node-wide device is evaluated), as the contract
    names them: the driver's unqualified, the standard ones qualified."""
    found = set()
    for expression in device_class.expressions:
        for domain, dotted, indexed in _NAMED.findall(expression):
            name = dotted or indexed
            found.add(name if domain == driver else f"{domain}/{name}")
    return sorted(found & HCA_ONLY_ATTRIBUTES)


def trapping(classes: Sequence[DeviceClass], driver: str) -> list[DeviceClass]:
    """The classes (each selecting ``driver``) that do not select on ``kind``."""
    return sorted((c for c in classes if not selects_kind(c, driver)), key=lambda c: c.name)


def trap_check(classes: Sequence[DeviceClass], driver: str) -> Check | None:
    """A failed check listing the trapping classes, None when there is none.

    Asked only when a slice of the driver holds the node-wide device: without one, a class
    without ``kind`` matches HCAs alone and traps nobody.
    """
    traps = trapping(classes, driver)
    if not traps:
        return None
    described = []
    for c in traps:
        only = hca_only_attributes(c, driver)
        fails = (f" (its selector names {', '.join(only)}, which {NODE_DEVICE} lacks: "
                 "allocation fails for every claim of it with \"CEL runtime error: no such "
                 f"key: {only[0]}\")") if only else ""
        described.append(f"{c.name}{fails}")
    return Check(
        "cluster", TITLE.format(driver=driver), False,
        f"{len(traps)} select {driver} without selecting the kind of device: "
        f"{', '.join(described)}. They also match the node-wide device {NODE_DEVICE} (every "
        "HCA of a node), so a claim for \"an HCA\" may get the whole node",
        f"add {hca_selector(driver)} to the class's selector (as the chart's class "
        f"{driver} does), e.g. kubectl edit deviceclass {traps[0].name}",
    )
