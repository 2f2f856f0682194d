"""The kubelet's checkpoint file: allocations that survive a kubelet restart."""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections import deque
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.devkit.sim.kubelet_records import PodDevices, ResourceState
from rdma_hca.devkit.sim.kubelet_rules import CHECKPOINT_NAME, NO_NUMA_NODE, UNHEALTHY


class CheckpointFile:
    """Writes and restores the checkpoint; the emulator's base."""

    _dir: Path
    _pods: list[PodDevices]
    _resources: dict[str, ResourceState]
    _events: deque[str]

    def _record(self, message: str) -> None:
        self._events.append(message)

    def _state(self, resource: str) -> ResourceState:
        return self._resources.setdefault(resource, ResourceState())


    @property
    def checkpoint_path(self) -> Path:
        return self._dir / CHECKPOINT_NAME

    def _checkpoint_data(self) -> dict[str, Any]:
        entries = []
        for pod in self._pods:
            by_numa: dict[str, list[str]] = {}
            devices = self._resources.get(pod.resource, ResourceState()).devices
            for device_id in pod.ids:
                device = devices.get(device_id)
                nodes = device.topology.nodes if device is not None else []
                key = str(nodes[0].ID) if nodes else NO_NUMA_NODE
                by_numa.setdefault(key, []).append(device_id)
            entries.append(
                {
                    "PodUID": pod.pod_uid,
                    "ContainerName": pod.container,
                    "ResourceName": pod.resource,
                    "DeviceIDs": by_numa,
                    "AllocResp": base64.b64encode(pod.response.SerializeToString()).decode(),
                }
            )
        registered = {name: sorted(r.devices) for name, r in sorted(self._resources.items())}
        return {"PodDeviceEntries": entries, "RegisteredDevices": registered}

    def _write_checkpoint(self) -> None:
        """Write the kubelet-shaped checkpoint atomically so a crash never leaves half a file.

        The checksum is a CRC32 of the canonical JSON of ``Data``: it detects corruption like
        the kubelet's does, but is not byte-compatible with the kubelet's own checksum.
        """
        data = self._checkpoint_data()
        body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        document = {"Data": data, "Checksum": zlib.crc32(body.encode())}
        tmp = self.checkpoint_path.with_name(CHECKPOINT_NAME + ".tmp")
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.checkpoint_path)

    def _load_checkpoint(self) -> None:
        """Restore allocations (and, like the kubelet, registered devices as unhealthy).

        An unreadable checkpoint is what the kubelet logs and then ignores; we record it as an
        event and start with no allocations.
        """
        path = self.checkpoint_path
        if not path.exists():
            return
        try:
            pods, registered = parse_checkpoint(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as err:
            self._record(
                f"checkpoint {path} is unreadable ({err}); continuing without it, device "
                "allocation info may not be up to date; delete the file to silence this"
            )
            return
        self._pods = pods
        for name, ids in registered.items():
            state = self._state(name)
            if not state.devices:
                state.devices = {i: api_pb2.Device(ID=i, health=UNHEALTHY) for i in ids}
        self._record(
            f"checkpoint restored: {len(pods)} container allocations, "
            f"{len(registered)} registered resources"
        )


def parse_checkpoint(text: str) -> tuple[list[PodDevices], dict[str, list[str]]]:
    """Read our checkpoint format, raising ValueError that names the bad part."""
    document = json.loads(text)
    if not isinstance(document, dict) or not isinstance(document.get("Data"), dict):
        raise ValueError("no 'Data' object at the top level")
    data = document["Data"]
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if document.get("Checksum") != zlib.crc32(body.encode()):
        raise ValueError("checksum does not match the data")
    pods: list[PodDevices] = []
    for index, entry in enumerate(data.get("PodDeviceEntries") or []):
        try:
            ids = [i for group in entry["DeviceIDs"].values() for i in group]
            response = api_pb2.ContainerAllocateResponse()
            response.ParseFromString(base64.b64decode(entry.get("AllocResp", "")))
            pods.append(
                PodDevices(
                    str(entry["PodUID"]),
                    str(entry["ContainerName"]),
                    str(entry["ResourceName"]),
                    [str(i) for i in ids],
                    response,
                )
            )
        except (KeyError, TypeError, AttributeError, ValueError, DecodeError) as err:
            raise ValueError(f"PodDeviceEntries[{index}] is malformed: {err!r}") from err
    registered_raw = data.get("RegisteredDevices") or {}
    if not isinstance(registered_raw, dict):
        raise ValueError("'RegisteredDevices' is not an object")
    registered = {str(k): [str(i) for i in v] for k, v in registered_raw.items()}
    return pods, registered
