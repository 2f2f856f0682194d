"""The claim the scheduler makes for a pod's extended resource (``DRAExtendedResource``).

As seen on a 1.36 cluster: a pod with ``resources.limits: {rdma/hca: N}`` and a
DeviceClass with ``extendedResourceName: rdma/hca`` gets a claim
``<pod>-extended-resources-<suffix>`` with one request ``container-<i>-request-0`` of
``exactly: {deviceClassName: <class>, count: N}``, N devices of that class. On a device
with ``allowMultipleAllocations`` each of them is an allocation of its own (a share ID,
and the capacity it consumed).
"""

from __future__ import annotations

import uuid
from typing import Any

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.kube.cluster import DRA


def request_name(container: int = 0) -> str:
    return f"container-{container}-request-0"


def extended_claim(api: FakeApiServer, namespace: str, pod: str, *, driver: str, pool: str,
                   device: str, device_class: str, count: int = 1, container: int = 0,
                   consumed: dict[str, str] | None = None) -> tuple[str, str]:
    """Store the allocated claim of ``pod``'s ``count`` units on ``device``; returns its
    (name, UID)."""
    name = f"{pod}-extended-resources-{uuid.uuid4().hex[:5]}"
    request = request_name(container)
    results: list[dict[str, Any]] = []
    for _ in range(count):
        r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool,
                             "device": device, "shareID": str(uuid.uuid4())}
        if consumed:
            r["consumedCapacity"] = dict(consumed)
        results.append(r)
    claim = api.put("resourceclaims", {
        "apiVersion": DRA, "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount",
            "count": count}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    })
    return name, str(claim["metadata"]["uid"])
