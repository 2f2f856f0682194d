"""Keeping this node's ResourceSlice equal to what the driver offers.

One pool per node (named after it), one slice in it. The slice carries a digest of its
device list in an annotation, so deciding "nothing to write" needs no comparison with
whatever defaults the API server filled in. Writes happen only when the offer changed,
or when the API server's copy is missing or different: the kubelet deletes a node's
slices when it starts and a driver's slices 30 s after the driver went away, so every
registration checks the server's copy again (``publish(check=True)``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from rdma_hca.daemon.dra.devices import DEVICES_HASH_ANNOTATION, Offer
from rdma_hca.daemon.dra.kubeapi import KubeApiError

log = logging.getLogger("rdma_hca.dra.slices")

GROUP_VERSION = "resource.k8s.io/v1"
CONFLICT_RETRIES = 3


class SliceClient(Protocol):
    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...
    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def delete_slice(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Published:
    name: str
    resource_version: str
    generation: int
    digest: str


def _generate_name(node: str, driver: str) -> str:
    base = re.sub(r"[^a-z0-9.-]+", "-", f"{node}-{driver}".lower()).strip("-.")
    return base[:200] + "-"


class SlicePublisher:
    def __init__(self, client: SliceClient, driver: str, node: str, pool: str) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.pool = pool
        self.published: Published | None = None
        self.writes = 0  # creates, updates and deletes made, for metrics and benchmarks

    @property
    def _annotation(self) -> str:
        return f"{self.driver}/{DEVICES_HASH_ANNOTATION}"

    def _object(self, offer: Offer, generation: int, name: str | None,
                resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"annotations": {self._annotation: offer.digest}}
        if name is None:
            meta["generateName"] = _generate_name(self.node, self.driver)
        else:
            meta["name"] = name
            if resource_version:
                meta["resourceVersion"] = resource_version
        return {
            "apiVersion": GROUP_VERSION,
            "kind": "ResourceSlice",
            "metadata": meta,
            "spec": {
                "driver": self.driver,
                "nodeName": self.node,
                "pool": {"name": self.pool, "generation": generation, "resourceSliceCount": 1},
                "devices": [dict(d) for d in offer.devices],
            },
        }

    async def publish(self, offer: Offer, *, check: bool = False) -> bool:
        """Make the API server hold ``offer``; returns True when anything was written.

        Without ``check``, an offer equal to the last one published is trusted to be
        there and costs no API call at all.
        """
        if not check and self.published is not None and self.published.digest == offer.digest:
            return False
        for attempt in range(CONFLICT_RETRIES):
            try:
                return await self._reconcile(offer)
            except KubeApiError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    self.published = None  # whatever is there now, look again next time
                    raise
                log.info("ResourceSlice changed under us (%s); reading it again", exc)
        return False  # not reached

    async def _reconcile(self, offer: Offer) -> bool:
        slices = await self.client.list_slices(self.node, self.driver)
        ours = [s for s in slices if s["spec"].get("pool", {}).get("name") == self.pool]
        others = [s for s in slices if s not in ours]  # this node's, but not our pool
        top = max((int(s["spec"]["pool"].get("generation", 0)) for s in ours), default=0)
        keep = next((s for s in ours if self._current(s, offer, top)), None)
        wrote = False
        if keep is None:
            # Update the slice we know (or any of ours) to the new content, one generation
            # above everything in the pool so the scheduler ignores the older slices.
            target = self._pick(ours)
            generation = top + 1
            if target is None:
                keep = await self.client.create_slice(self._object(offer, generation, None, None))
                log.info("ResourceSlice %s created: %d device(s), pool generation %d",
                         keep["metadata"]["name"], len(offer.devices), generation)
            else:
                meta = target["metadata"]
                keep = await self.client.replace_slice(
                    self._object(offer, generation, meta["name"], meta.get("resourceVersion")))
                log.info("ResourceSlice %s updated: %d device(s), pool generation %d",
                         meta["name"], len(offer.devices), generation)
            self.writes += 1
            wrote = True
        for stale in ours + others:
            if stale["metadata"]["name"] != keep["metadata"]["name"]:
                await self.client.delete_slice(stale["metadata"]["name"])
                log.info("stale ResourceSlice %s of this node deleted", stale["metadata"]["name"])
                self.writes += 1
                wrote = True
        self.published = Published(keep["metadata"]["name"],
                                   keep["metadata"].get("resourceVersion", ""),
                                   int(keep["spec"]["pool"]["generation"]), offer.digest)
        return wrote

    def _current(self, obj: dict[str, Any], offer: Offer, top: int) -> bool:
        annotations = obj["metadata"].get("annotations") or {}
        pool = obj["spec"].get("pool", {})
        return (annotations.get(self._annotation) == offer.digest
                and int(pool.get("generation", 0)) == top
                and pool.get("resourceSliceCount") == 1)

    def _pick(self, ours: list[dict[str, Any]]) -> dict[str, Any] | None:
        if self.published is not None:
            for s in ours:
                if s["metadata"]["name"] == self.published.name:
                    return s
        return ours[0] if ours else None
