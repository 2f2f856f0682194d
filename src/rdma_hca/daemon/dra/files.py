"""One CDI spec per prepared claim: what it holds, where it lives, and reading it back.

The spec is built by the one CDI builder (``offer/cdi.py``) and written like every file
the daemon owns (temp file, fsync, rename: containerd notices only a spec written or
renamed inside its directory). Its annotations name the claim and, per device, the pool,
the device, the HCA and the requests: that is what lets a lost checkpoint be rebuilt
from the specs. The spec's kind, its devices' names and the annotation keys are the
contract's (``contract/cdi.py``). Everything here blocks; the driver runs it off the loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rdma_hca.contract import cdi
from rdma_hca.contract.cdi import CDI_CLASS, cdi_device_name, cdi_id, cdi_kind, note
from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice, Share, request_names
from rdma_hca.contract.hcaconfig import HcaConfig, HcaConfigError, check_fields
from rdma_hca.daemon.dra.claims import ClaimConfigError
from rdma_hca.daemon.offer.cdi import CdiDevice, cdi_name, make_spec
from rdma_hca.daemon.offer.env import EnvSettings, container_env
from rdma_hca.kit.files import write_temp
from rdma_hca.node.model import CharDevice, Hca

log = logging.getLogger(__name__)

# What the claim holds of each HCA's bandwidth: ``mlx5_0=100000000000,mlx5_3=0`` (bits
# per second, in RDMA_HCA_DEVICES' order); set only when it holds some (docs/nccl.md).
RDMA_HCA_BANDWIDTH = "RDMA_HCA_BANDWIDTH"
NOTHING = HcaConfig()  # nothing asked: the driver's defaults


def _spec_prefix(driver: str) -> str:
    return cdi_name(f"{driver}-{CDI_CLASS}-")


def cdi_spec_path(spec_dir: str, driver: str, claim_uid: str) -> str:
    # cdi_name cleans one character at a time: the prefix and the UID apart are the same.
    return os.path.join(spec_dir, _spec_prefix(driver) + cdi_name(claim_uid) + ".json")


def claim_env(hcas: Sequence[Hca], env: EnvSettings,
              claim: PreparedClaim | None = None, asked: HcaConfig | None = None) -> list[str]:
    """The variables the device plugin's Allocate would set, built from the claim's own
    HCAs (``daemon/offer/env.py``) with what the claim ``asked`` for, and the bandwidth
    the claim holds of them. A GID the HCAs lack is a ClaimConfigError."""
    try:
        built = container_env(hcas, env, asked)
    except HcaConfigError as exc:
        raise ClaimConfigError(str(exc)) from exc
    variables = [f"{k}={v}" for k, v in built.items()]
    held: dict[str, int] = {}
    for d in claim.devices if claim is not None else ():
        held[d.hca] = held.get(d.hca, 0) + d.bandwidth
    if any(held.values()):
        variables.append(f"{RDMA_HCA_BANDWIDTH}=" + ",".join(
            f"{h.name}={held.get(h.name, 0)}" for h in hcas))
    return variables


def device_nodes(hca: Hca, management: bool | None = None) -> tuple[CharDevice, ...]:
    """The HCA's device nodes a claim gets: by default what the device plugin gives
    (uverbs, umad on InfiniBand ports); asked for ``managementDevices``, with (umad and
    issm of every port) or without (uverbs alone) the management nodes."""
    if management is None:
        return hca.device_nodes()
    nodes = [hca.uverbs] if hca.uverbs is not None else []
    if management:
        nodes += [n for p in hca.ports for n in (p.umad, p.issm) if n is not None]
    return tuple(nodes)


def with_config(claim: PreparedClaim, asked: Mapping[str, HcaConfig]) -> PreparedClaim:
    """``claim`` with what each device's requests asked for (``asked``, by device)."""
    return replace(claim, devices=tuple(replace(d, config=asked.get(d.device, NOTHING))
                                        for d in claim.devices))


def claim_spec(driver: str, claim_uid: str, claim: PreparedClaim,
               hcas: Mapping[str, Sequence[Hca]], rdma_cm: CharDevice | None,
               env: Mapping[str, Sequence[str]],
               mounts: Mapping[str, Sequence[tuple[str, str]]] | None = None
               ) -> dict[str, Any]:
    """The CDI spec of one claim: one CDI device per allocated device, with the device
    nodes of its HCAs (``hcas`` by device: one, or every usable HCA for the node-wide one).

    Every device carries the claim's whole HCA list in its env (``env`` by device, from
    :func:`claim_env`): the same for all of them unless their requests asked for
    different settings (``PreparedDevice.config``), so a container naming a request gets
    that request's; ``mounts`` (by device) are the device metadata files of its requests.
    """
    devices = [
        CdiDevice(cdi_device_name(claim_uid, d.device),
                  [n for h in hcas[d.device]
                   for n in device_nodes(h, d.config.management_devices)],
                  env[d.device],
                  {note(driver, cdi.DEVICE): d.device, note(driver, cdi.POOL): d.pool,
                   note(driver, cdi.HCA): d.hca,
                   note(driver, cdi.REQUESTS): ",".join(d.request_names),
                   **_share_notes(driver, d), **_config_notes(driver, d),
                   **({note(driver, cdi.ADMIN_ACCESS): "true"} if d.admin_access else {})},
                  tuple((mounts or {}).get(d.device, ())))
        for d in claim.devices
    ]
    return make_spec(cdi_kind(driver), devices, rdma_cm, {
        note(driver, cdi.CLAIM_UID): claim_uid,
        note(driver, cdi.CLAIM_NAMESPACE): claim.namespace,
        note(driver, cdi.CLAIM_NAME): claim.name})


def _share_notes(driver: str, d: PreparedDevice) -> dict[str, str]:
    """The device's shares, ``<shareID>=<bits per second>`` each, comma-separated."""
    if not d.shares:
        return {}
    return {note(driver, cdi.SHARES): ",".join(f"{s.share_id}={s.bandwidth}" for s in d.shares)}


def _config_notes(driver: str, d: PreparedDevice) -> dict[str, str]:
    if d.config.empty:
        return {}
    return {note(driver, cdi.CONFIG): json.dumps(d.config.as_fields(), sort_keys=True,
                                                 separators=(",", ":"))}


def _config_of(text: object) -> HcaConfig:
    """The settings a spec's device notes; a note that cannot be read: none (the spec is
    written again from a claim that was checked)."""
    if not isinstance(text, str):
        return NOTHING
    try:
        raw = json.loads(text)
        return check_fields(raw) if isinstance(raw, dict) else NOTHING
    except ValueError:
        return NOTHING


def _shares_of(text: object) -> tuple[Share, ...]:
    shares = []
    for part in str(text or "").split(","):
        share_id, _, bits = part.partition("=")
        if share_id:
            shares.append(Share(share_id, int(bits) if bits.isdigit() else 0))
    return tuple(shares)


def write_claim_spec(spec_dir: str, driver: str, claim_uid: str,
                     spec: Mapping[str, Any]) -> str:
    """A claim's CDI spec written in one step (flushed and put in place): its path."""
    staged = staged_claim_spec(spec_dir, driver, claim_uid, spec)
    staged.place()
    return staged.path


class StagedFile:
    """A file's new content, durable in a temp file beside it (``flush``) before one rename
    puts it in place (``place``): flushed while something else is written, it costs no
    time of its own. ``discard`` drops a temp file never placed. Blocking, and used by one
    thread at a time."""

    def __init__(self, path: str, text: str, mode: int = 0o644) -> None:
        self.path = path
        self._text = text
        self._mode = mode
        self._temp: str | None = None

    def flush(self) -> None:
        """Write the temp file and fsync it; on a failure nothing is left behind."""
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        self._temp = write_temp(directory, self._text, self._mode)

    def place(self) -> None:
        """Rename the flushed temp file over the file (flushed first if it was not)."""
        if self._temp is None:
            self.flush()
        assert self._temp is not None
        try:
            os.replace(self._temp, self.path)
        except BaseException:
            self.discard()
            raise
        self._temp = None

    def discard(self) -> None:
        temp, self._temp = self._temp, None
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def staged_claim_spec(spec_dir: str, driver: str, claim_uid: str,
                      spec: Mapping[str, Any]) -> StagedFile:
    """A claim's CDI spec, to be flushed to a temp file and put in place.

    Compact JSON, as the Go CDI library writes it: its readers (containerd, CRI-O, the
    driver's recovery) parse it, and an indented dump takes Python's pure-Python encoder,
    on the event loop in the middle of every Prepare (keys still sorted: the same claim
    gives the same text)."""
    return StagedFile(cdi_spec_path(spec_dir, driver, claim_uid),
                      json.dumps(spec, sort_keys=True, separators=(",", ":")) + "\n")


def remove_claim_spec(spec_dir: str, driver: str, claim_uid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cdi_spec_path(spec_dir, driver, claim_uid))


def claim_from_spec(spec: Mapping[str, Any], driver: str) -> tuple[str, PreparedClaim] | None:
    """The claim a spec of ours describes, or None when it is not one of ours (or lacks
    the annotations, as specs written before they existed do)."""
    notes = spec.get("annotations") or {}
    uid = notes.get(note(driver, cdi.CLAIM_UID))
    if spec.get("kind") != cdi_kind(driver) or not isinstance(uid, str):
        return None
    devices = []
    for d in spec.get("devices") or []:
        dn = d.get("annotations") or {}
        device = dn.get(note(driver, cdi.DEVICE))
        if not isinstance(device, str):
            return None
        requests = str(dn.get(note(driver, cdi.REQUESTS), ""))
        devices.append(PreparedDevice(
            request_names(requests.split(",")) if requests else (),
            str(dn.get(note(driver, cdi.POOL), "")), device,
            str(dn.get(note(driver, cdi.HCA), "")), (cdi_id(driver, uid, device),),
            _shares_of(dn.get(note(driver, cdi.SHARES))),
            _config_of(dn.get(note(driver, cdi.CONFIG))),
            dn.get(note(driver, cdi.ADMIN_ACCESS)) == "true"))
    claim = PreparedClaim(str(notes.get(note(driver, cdi.CLAIM_NAMESPACE), "")),
                          str(notes.get(note(driver, cdi.CLAIM_NAME), "")), tuple(devices))
    return uid, claim


def read_claim_specs(spec_dir: str, driver: str) -> dict[str, PreparedClaim]:
    """Every claim this driver's specs in ``spec_dir`` describe; unreadable ones skipped."""
    prefix = _spec_prefix(driver)
    try:
        names = sorted(os.listdir(spec_dir))
    except FileNotFoundError:
        return {}
    found: dict[str, PreparedClaim] = {}
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(spec_dir, name), encoding="utf-8") as f:
                spec = json.load(f)
            parsed = claim_from_spec(spec, driver) if isinstance(spec, dict) else None
        except (OSError, ValueError) as exc:
            log.warning("CDI spec %s cannot be read (%s); skipped", name, exc)
            continue
        if parsed is not None:
            found[parsed[0]] = parsed[1]
    return found
