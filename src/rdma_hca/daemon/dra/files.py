"""The driver's files: one CDI spec per prepared claim, and the checkpoint of claims.

Both are written the same way: a temp file in the target directory, fsync, rename.
containerd only notices a CDI spec written or renamed inside its directory, and a
checkpoint cut short by a crash must leave the previous one intact. Everything here
blocks; the driver runs it off the loop on threads of its own, with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rdma_hca.kit.files import write_atomic
from rdma_hca.node.model import CharDevice, Hca

CDI_VERSION = "0.6.0"
CDI_CLASS = "claim"
CHECKPOINT_VERSION = 1


# --- CDI ---------------------------------------------------------------------------------


def cdi_kind(driver: str) -> str:
    return f"{driver}/{CDI_CLASS}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{claim_uid}-{device}")


def cdi_id(driver: str, claim_uid: str, device: str) -> str:
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid, device)}"


def cdi_spec_path(spec_dir: str, driver: str, claim_uid: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{driver}-{CDI_CLASS}-{claim_uid}")
    return os.path.join(spec_dir, safe + ".json")


def _node(dev: CharDevice) -> dict[str, str]:
    return {"path": dev.path, "hostPath": dev.path, "permissions": "rw"}


def claim_spec(driver: str, claim_uid: str, devices: Mapping[str, Hca],
               rdma_cm: CharDevice | None, container_env: Mapping[str, str]) -> dict[str, Any]:
    """The CDI spec of one claim: one CDI device per allocated HCA.

    Every device carries the claim's whole env (``daemon/offer/env.py``, built from the
    claim's own HCAs), so a container gets one consistent value.
    """
    env = [f"{k}={v}" for k, v in container_env.items()]
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver),
        "devices": [
            {"name": cdi_device_name(claim_uid, dev),
             "containerEdits": {"deviceNodes": [_node(d) for d in hca.device_nodes()],
                                "env": env}}
            for dev, hca in devices.items()
        ],
    }
    if rdma_cm is not None:
        spec["containerEdits"] = {"deviceNodes": [_node(rdma_cm)]}
    return spec


def write_claim_spec(spec_dir: str, driver: str, claim_uid: str,
                     spec: Mapping[str, Any]) -> str:
    path = cdi_spec_path(spec_dir, driver, claim_uid)
    write_atomic(path, json.dumps(spec, indent=2, sort_keys=True) + "\n")
    return path


def remove_claim_spec(spec_dir: str, driver: str, claim_uid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cdi_spec_path(spec_dir, driver, claim_uid))


# --- checkpoint --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    hca: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...] = field(default=())


class CheckpointError(ValueError):
    """The checkpoint file exists but cannot be read as one."""


def load_checkpoint(path: str) -> dict[str, PreparedClaim]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} is not a version {CHECKPOINT_VERSION} checkpoint")
    try:
        return {
            uid: PreparedClaim(
                c["namespace"], c["name"],
                tuple(PreparedDevice(tuple(d["request_names"]), d["pool"], d["device"],
                                     d["hca"], tuple(d["cdi_ids"])) for d in c["devices"]))
            for uid, c in raw.get("claims", {}).items()
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} has a malformed claim entry: {exc}") from exc


def save_checkpoint(path: str, claims: Mapping[str, PreparedClaim]) -> None:
    data = {"version": CHECKPOINT_VERSION,
            "claims": {uid: asdict(c) for uid, c in sorted(claims.items())}}
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode=0o600)
