"""The CDI spec that describes the node's HCAs to the container runtime.

With CDI on, Allocate names devices (``rdma-hca.io/hca=mlx5_0``) instead of listing
device nodes, and the runtime reads what each name means from this file. The
file must therefore always describe the HCAs the plugin currently advertises:
it is rewritten whenever discovery changes, atomically (write, fsync, rename), so a
runtime never reads half a file.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdma_hca.daemon.offer.env import NO_NCCL_ENV
from rdma_hca.daemon.offer.env import build as build_env
from rdma_hca.kit.files import write_atomic
from rdma_hca.node.model import CharDevice, Hca

log = logging.getLogger(__name__)

CDI_VENDOR_CLASS = "rdma-hca.io/hca"


def cdi_name(hca_name: str) -> str:
    """``name`` as CDI allows names (of devices, of spec files): only letters, digits,
    '_', '.' and '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", hca_name)


def qualified_name(hca_name: str) -> str:
    """What Allocate names: ``rdma-hca.io/hca=mlx5_0``."""
    return f"{CDI_VENDOR_CLASS}={cdi_name(hca_name)}"

# The lowest spec version that has every field written here; runtimes refuse a
# spec whose version is newer than they know, so a low version loads everywhere.
CDI_VERSION = "0.6.0"
SPEC_FILE = CDI_VENDOR_CLASS.replace("/", "-") + ".json"
ALL_DEVICE = "all"


def _node(dev: CharDevice) -> dict[str, str]:
    return {"path": dev.path, "hostPath": dev.path, "permissions": "rw"}


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One CDI device: its name, the device nodes, env and files it adds, what it says of
    itself. ``mounts`` are (host path, container path) pairs, bound read-only."""

    name: str
    nodes: Sequence[CharDevice]
    env: Sequence[str] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[tuple[str, str]] = ()


def make_spec(kind: str, devices: Iterable[CdiDevice], rdma_cm: CharDevice | None,
              annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A CDI spec: the one builder of the device plugin's spec and of every claim's spec.

    ``rdma_cm`` goes into the spec-wide edits: every RDMA container needs it, whichever
    HCAs it gets. Annotations (CDI 0.6.0) let the driver read back what a spec is for.
    """
    out: list[dict[str, Any]] = []
    for d in devices:
        edits: dict[str, Any] = {"deviceNodes": [_node(n) for n in d.nodes]}
        if d.env:
            edits["env"] = list(d.env)
        if d.mounts:
            edits["mounts"] = [{"hostPath": host, "containerPath": inside,
                                "options": ["ro", "bind"]} for host, inside in d.mounts]
        entry: dict[str, Any] = {"name": d.name, "containerEdits": edits}
        if d.annotations:
            entry["annotations"] = dict(d.annotations)
        out.append(entry)
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind, "devices": out}
    if annotations:
        spec["annotations"] = dict(annotations)
    if rdma_cm is not None:
        spec["containerEdits"] = {"deviceNodes": [_node(rdma_cm)]}
    return spec


def build_spec(hcas: Iterable[Hca], rdma_cm: CharDevice | None) -> dict[str, Any]:
    """The device plugin's spec: one device per usable HCA, and ``all``."""
    usable = [h for h in hcas if h.usable]
    devices = [CdiDevice(cdi_name(h.name), h.device_nodes()) for h in usable]
    devices.append(CdiDevice(
        ALL_DEVICE, [d for h in usable for d in h.device_nodes()],
        [f"{k}={v}" for k, v in build_env(usable, NO_NCCL_ENV).variables]))
    return make_spec(CDI_VENDOR_CLASS, devices, rdma_cm)


def write_spec(spec_dir: str, spec: dict[str, Any]) -> bool:
    """Write the spec if it changed; returns True when the file was (re)written."""
    os.makedirs(spec_dir, exist_ok=True)
    path = os.path.join(spec_dir, SPEC_FILE)
    data = json.dumps(spec, indent=2, sort_keys=True) + "\n"
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == data:
                return False
    except OSError:
        pass
    write_atomic(path, data, mode=0o644)
    log.info("CDI spec %s written: %d device(s)", path, len(spec["devices"]))
    return True
