"""The DRA driver's checkpoint file format: the prepared claims, pure (no locks).

The driver writes the file (``daemon/dra/checkpoint.py`` adds the locks that let two
instances share it); ``rdma-hca doctor --node`` reads it to say who holds how much of
each HCA. Both read it with :func:`decode`, so they never disagree on what it says.

The file is versioned and carries a checksum of its claims, so a file cut short or
edited by hand is told from a good one; version 1 (no checksum) is still read. Version 2
gained the shares of a device (``shares``: each allocation result's shareID and the
bandwidth it consumed) as an optional key, written only when a device has shares: a
file without shares is byte for byte what an older driver writes, and an older driver
reads a file with them (it ignores the key; the checksum covers what it read). The
settings a device's requests asked for (``config``: HcaConfig's fields) are kept the
same way, so a CDI spec lost in a reboot is written again as it was; and so is
``admin_access`` (a device given to a claim with admin access, which holds nothing of
its HCA), written only when true.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rdma_hca.contract.dra import request_name
from rdma_hca.contract.hcaconfig import HcaConfig, check_fields

CHECKPOINT_VERSION = 2
CHECKPOINT_FILE = "checkpoint.json"  # in <kubelet root>/plugins/<driver name>/


@dataclass(frozen=True, slots=True)
class Share:
    """One allocation result on a device that allows several (consumable capacity)."""

    share_id: str
    bandwidth: int = 0  # bits per second of the device's bandwidth capacity it consumed


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    hca: str
    cdi_ids: tuple[str, ...]
    # A device two requests of one claim got holds two shares: the bandwidths add up.
    shares: tuple[Share, ...] = ()
    # What its requests asked for (HcaConfig parameters).
    config: HcaConfig = field(default_factory=HcaConfig)
    # Allocated with adminAccess: given to watch the HCA beside its holders, holding none.
    admin_access: bool = False

    @property
    def bandwidth(self) -> int:
        """Bits per second of the HCA the claim holds through this device."""
        return 0 if self.admin_access else sum(s.bandwidth for s in self.shares)


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...] = field(default=())


Claims = dict[str, PreparedClaim]


class CheckpointError(ValueError):
    """The checkpoint file exists but cannot be read as one."""


def _device_json(d: PreparedDevice) -> dict[str, object]:
    out: dict[str, object] = {"request_names": list(d.request_names), "pool": d.pool,
                              "device": d.device, "hca": d.hca, "cdi_ids": list(d.cdi_ids)}
    if d.shares:
        out["shares"] = [{"id": s.share_id, "bandwidth": s.bandwidth} for s in d.shares]
    if not d.config.empty:
        out["config"] = d.config.as_fields()
    if d.admin_access:
        out["admin_access"] = True
    return out


def _claim_json(c: PreparedClaim) -> dict[str, object]:
    return {"namespace": c.namespace, "name": c.name,
            "devices": [_device_json(d) for d in c.devices]}


def _canonical(claims_json: object) -> str:
    return json.dumps(claims_json, sort_keys=True, separators=(",", ":"))


def checksum(claims_json: object) -> str:
    return "sha256:" + hashlib.sha256(_canonical(claims_json).encode()).hexdigest()


class EncodedClaims:
    """Each claim's canonical JSON as last encoded, kept for the next :func:`encode` while
    the claim is the same object (claims are frozen): a writer that changes one claim of
    many then encodes one. Holds only the claims of the last call; not thread-safe (its
    writer encodes under its own lock)."""

    def __init__(self) -> None:
        self._parts: dict[str, tuple[PreparedClaim, str]] = {}

    def __len__(self) -> int:
        """Claims held: those of the last call."""
        return len(self._parts)

    def body(self, claims: Mapping[str, PreparedClaim]) -> str:
        """``_canonical`` of the claims' JSON, byte for byte: the top level's keys sorted,
        each entry as it encodes alone."""
        old, parts = self._parts, {}
        for uid in sorted(claims):
            claim = claims[uid]
            part = old.get(uid)
            if part is None or part[0] is not claim:
                part = (claim, _canonical(uid) + ":" + _canonical(_claim_json(claim)))
            parts[uid] = part
        self._parts = parts
        return "{" + ",".join(text for _, text in parts.values()) + "}"


def encode(claims: Mapping[str, PreparedClaim], memo: EncodedClaims | None = None) -> str:
    """The file: the claims in canonical JSON, and the checksum of exactly that text.
    ``memo``: the entries of an earlier call, reused for the claims that did not change."""
    body = (_canonical({uid: _claim_json(c) for uid, c in claims.items()}) if memo is None
            else memo.body(claims))
    digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    return (f'{{"version": {CHECKPOINT_VERSION}, "checksum": "{digest}",\n'
            f' "claims": {body}}}\n')


def _shares(raw: object) -> tuple[Share, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TypeError(f"shares must be a list, not {type(raw).__name__}")
    out = []
    for s in raw:
        bandwidth = s.get("bandwidth", 0)
        if not isinstance(bandwidth, int) or isinstance(bandwidth, bool) or bandwidth < 0:
            raise TypeError(f"a share's bandwidth must be a whole number of bits per second, "
                            f"not {bandwidth!r}")
        out.append(Share(str(s["id"]), bandwidth))
    return tuple(out)


def request_names(names: Iterable[str]) -> tuple[str, ...]:
    """The names a device answers the kubelet under, each once: a driver before 1.36's
    rules wrote a prioritized list's ``<request>/<subrequest>`` in full; read as the
    request it is, so a claim it prepared reaches the containers that name it."""
    return tuple(dict.fromkeys(request_name(str(n)) for n in names))


def _flag(raw: object, key: str) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(f"{key} must be true or false, not {raw!r}")
    return raw


def decode(text: str, path: str) -> tuple[Claims, int]:
    """The claims in ``text`` and the version they were written in."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc}") from exc
    version = raw.get("version") if isinstance(raw, dict) else None
    if version not in (1, CHECKPOINT_VERSION):
        raise CheckpointError(f"{path} is not a checkpoint of version 1 or "
                              f"{CHECKPOINT_VERSION} (version {version!r})")
    assert isinstance(raw, dict)
    body = raw.get("claims", {})
    if version == CHECKPOINT_VERSION and raw.get("checksum") != checksum(body):
        raise CheckpointError(f"{path} does not match its checksum (cut short or edited)")
    try:
        claims = {
            str(uid): PreparedClaim(
                str(c["namespace"]), str(c["name"]),
                tuple(PreparedDevice(request_names(d["request_names"]), d["pool"], d["device"],
                                     d["hca"], tuple(d["cdi_ids"]), _shares(d.get("shares")),
                                     check_fields(d.get("config") or {}),
                                     _flag(d.get("admin_access", False), "admin_access"))
                      for d in c["devices"]))
            for uid, c in body.items()
        }
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise CheckpointError(f"{path} has a malformed claim entry: {exc}") from exc
    return claims, int(version)


def load_checkpoint(path: str) -> tuple[Claims, int]:
    """The claims on disk and their version; no file: none, of the current version.

    Blocks: the driver calls it off its event loop."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}, CHECKPOINT_VERSION
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc}") from exc
    return decode(text, path)
