"""Objects as a cluster holds them (nodes, the DaemonSet, its pods, DRA objects), for tests
and scenarios that seed the fake API server.
"""

from __future__ import annotations

from typing import Any

from rdma_hca.contract.dra import HCA_NAME, LINK_DOWN_TAINT, LINK_STATE, PCIE_ROOT, qualified

CREATED = "2024-05-01T00:00:00Z"


# ------------------------------------------------------------------ objects as a cluster has them


def node(name: str, *, hca: str | None = "1k", allocatable: str | None = None,
         labels: dict[str, str] | None = None, ready: bool = True) -> dict[str, Any]:
    """A node as ``GET /api/v1/nodes`` lists it, like the seed guide's e01-cn-xxxx."""
    capacity: dict[str, str] = {"cpu": "192", "memory": "2112881480Ki", "nvidia.com/gpu": "8",
                                "pods": "64"}
    alloc: dict[str, str] = {"cpu": "189280m", "memory": "2063229768Ki", "nvidia.com/gpu": "8",
                             "pods": "64"}
    if hca is not None:
        capacity["rdma/hca"] = hca
        alloc["rdma/hca"] = allocatable if allocatable is not None else hca
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": CREATED,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       **(labels or {})},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "KubeletNotReady"}],
        },
    }


DS_LABELS = {"app": "ack-rdma-dp", "component": "rdma-device-plugin"}


def daemonset(*, desired: int, ready: int, node_selector: dict[str, str] | None = None,
              name: str = "ack-rdma-dp-ds", namespace: str = "kube-system",
              created: str = CREATED) -> dict[str, Any]:
    return {
        "kind": "DaemonSet",
        "apiVersion": "apps/v1",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-ds", "generation": 1,
                     "creationTimestamp": created},
        "spec": {
            "selector": {"matchLabels": dict(DS_LABELS)},
            "template": {
                "metadata": {"labels": dict(DS_LABELS)},
                "spec": {"nodeSelector": node_selector or {}, "hostNetwork": True,
                         "containers": [{"name": "rdma-hca", "image": "rdma-hca:0.1.0"}]},
            },
        },
        "status": {
            "currentNumberScheduled": desired,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "observedGeneration": 1,
            "updatedNumberScheduled": desired,
            "numberAvailable": ready,
            **({"numberUnavailable": desired - ready} if desired > ready else {}),
        },
    }


def pod(name: str, node_name: str, *, ready: bool = True, waiting: str | None = None,
        namespace: str = "kube-system", env: dict[str, str] | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": CREATED}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": "back-off restarting"}}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**DS_LABELS, "controller-revision-hash": "6d4b8f7c9"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "ack-rdma-dp-ds", "uid": "uid-ds", "controller": True}],
        },
        "spec": {"nodeName": node_name, "hostNetwork": True,
                 "containers": [{"name": "rdma-hca", "image": "rdma-hca:0.1.0",
                                 **({"env": [{"name": k, "value": v} for k, v in env.items()]}
                                    if env else {})}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [{"name": "rdma-hca", "ready": ready, "restartCount": 0,
                                   "image": "rdma-hca:0.1.0", "imageID": "",
                                   "state": state}],
        },
    }


# ---------------------------------------------------------------- DRA objects as the driver writes

DRIVER = "rdma-hca.io"


def dra_device(hca: str, *, down: bool = False, taint: bool = True,
               driver: str = DRIVER) -> dict[str, Any]:
    """A device as the driver publishes it: a port down sets linkState and (taint) a taint."""
    attrs = {
        PCIE_ROOT: {"string": "pci0000:37"},
        qualified(driver, HCA_NAME): {"string": hca},
        qualified(driver, LINK_STATE): {"string": "down" if down else "up"},
    }
    device: dict[str, Any] = {"name": hca.replace("_", "-"), "attributes": attrs,
                              "allowMultipleAllocations": True}
    if down and taint:
        device["taints"] = [{"key": qualified(driver, LINK_DOWN_TAINT), "value": "down",
                             "effect": "NoSchedule"}]
    return device


def resource_slice(node_name: str, devices: list[dict[str, Any]] | None = None, *,
                   name: str | None = None, pool: str | None = None, generation: int = 1,
                   driver: str = DRIVER) -> dict[str, Any]:
    if devices is None:
        devices = [dra_device(f"mlx5_{i}", driver=driver) for i in range(4)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}-x7k2p", "uid": f"uid-{name}",
                     "resourceVersion": "100", "creationTimestamp": CREATED},
        "spec": {"driver": driver, "nodeName": node_name,
                 "pool": {"name": pool or node_name, "generation": generation,
                          "resourceSliceCount": 1},
                 "devices": devices},
    }


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "creationTimestamp": CREATED},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
