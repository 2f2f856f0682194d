"""The driver's API server calls, through the one client (rdma_hca.kube), as plain dicts.

Credentials: a kubeconfig file when one is given, else as ``SERVE_CREDENTIALS`` says.
lightkube loads only when the driver starts, off the event loop once its sockets are served.

Two budgets (client-side rate limits), so a pod's start never queues behind what the
driver sends on its own:

- ``claims`` (``dra.claimApiQps``/``dra.claimApiBurst``): the claim reads of
  NodePrepareResources. The kubelet paces those already: it calls Prepare once per pod
  start, under its own client budget.
- ``driver`` (``dra.apiQps``/``dra.apiBurst``): everything the driver sends on its own.
  Slice writes, the resync LIST and the Node read go first; claim status writes (and
  their re-reads on a conflict) take only the tokens those leave, so a taint never
  waits behind a backlog of status writes.

Claim status is the one typed exchange here: the claim is read as the same
:class:`~rdma_hca.daemon.dra.claims.Claim` Prepare reads, its entries applied as
``claimrecords``, so the status writer never reads a claim's dict.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

from rdma_hca.contract.dra import GROUP_VERSION
from rdma_hca.daemon.dra.claimrecords import DeviceEntry, apply_body
from rdma_hca.daemon.dra.claims import Claim, read_claim
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kube.client import ApiClient, HttpBuilder, read_credentials
from rdma_hca.kube.credentials import CredentialSearch
from rdma_hca.kube.errors import KubeError
from rdma_hca.kube.policy import ClientPolicy, Priority, Rate
from rdma_hca.kube.tally import ApiTally
from rdma_hca.settings.model import (
    DEFAULT_API_BURST,
    DEFAULT_API_QPS,
    DEFAULT_CLAIM_API_BURST,
    DEFAULT_CLAIM_API_QPS,
)

# The driver's code catches this name; it is the one client's error.
KubeApiError = KubeError

SLICES = f"/apis/{GROUP_VERSION}/resourceslices"
DRIVER_BUDGET = "driver"
CLAIMS_BUDGET = "claims"
BUDGETS = (CLAIMS_BUDGET, DRIVER_BUDGET)
# What the driver sends, each with the code it answers when all is well: the series of
# rdma_hca_api_requests_total that exist from the start.
KNOWN_REQUESTS = (
    ("resourceclaims", "get", "200"),
    ("resourceclaims/status", "update", "200"),
    ("resourceclaims/status", "apply", "200"),
    ("resourceslices", "list", "200"),
    ("resourceslices", "create", "201"),
    ("resourceslices", "update", "200"),
    ("resourceslices", "delete", "200"),
    ("nodes", "get", "200"),
)
# serve has no credential flags: in a pod its service account, else a kubeconfig file.
SERVE_CREDENTIALS = CredentialSearch(
    in_cluster_first=True,
    in_pod_fix="run it in a pod with its service account token mounted (the chart does when "
               "dra.enabled is true)")


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def claim_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP_VERSION}/namespaces/{_q(namespace)}/resourceclaims/{_q(name)}"


class SliceApi:
    """ResourceSlices of one driver on one node, its Node, and ResourceClaims."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        client.tally.expect(KNOWN_REQUESTS, BUDGETS)

    @classmethod
    async def open(cls, kubeconfig: str | None, timeout: float, *,
                   qps: float = DEFAULT_API_QPS, burst: int = DEFAULT_API_BURST,
                   claim_qps: float = DEFAULT_CLAIM_API_QPS,
                   claim_burst: int = DEFAULT_CLAIM_API_BURST,
                   off: OffLoop | None = None, build: HttpBuilder | None = None,
                   now: bool = True) -> SliceApi:
        """Read credentials (files: off the event loop, within ``off``'s deadline when
        given) and start the client: ``qps``/``burst`` the driver's own budget,
        ``claim_qps``/``claim_burst`` the claim reads'. Its HTTP client is built off the
        loop (``build``: how, lightkube's by default), at once or with ``now`` False from
        the first call or :meth:`ready` on; calls wait for it, :meth:`ready` says whether
        it could be built."""
        creds = await read_credentials(kubeconfig, SERVE_CREDENTIALS, off=off)
        client = ApiClient.starting(
            creds, ClientPolicy(qps=qps, burst=burst, timeout=timeout, budget=timeout,
                                rate_name=DRIVER_BUDGET,
                                rates=(Rate(CLAIMS_BUDGET, claim_qps, claim_burst),)),
            off=off, now=now, build=build)
        return cls(client)

    @classmethod
    async def connect(cls, kubeconfig: str | None, timeout: float, **kw: Any) -> SliceApi:
        """:meth:`open`, then wait until it is :meth:`ready`."""
        api = await cls.open(kubeconfig, timeout, **kw)
        try:
            await api.ready()
        except BaseException:
            await api.close()
            raise
        return api

    async def ready(self) -> None:
        """Build the client if not begun, and return once it can send; raise the
        KubeError that kept it from it."""
        await self.client.ready()

    async def close(self) -> None:
        await self.client.close()

    async def get_node(self, name: str) -> dict[str, Any]:
        return await self.client.get(f"/api/v1/nodes/{_q(name)}")

    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        found = await self.client.get(
            SLICES, {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"})
        # The field selector already did this; a server that ignored it must not make us
        # touch another node's slices.
        return [s for s in found.get("items") or []
                if s.get("spec", {}).get("nodeName") == node
                and s.get("spec", {}).get("driver") == driver]

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.client.request("POST", SLICES, body=obj)

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        return await self.client.request("PUT", f"{SLICES}/{_q(name)}", body=obj)

    async def delete_slice(self, name: str) -> None:
        try:
            await self.client.request("DELETE", f"{SLICES}/{_q(name)}")
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim, for a Prepare: on the claims' budget."""
        return await self.client.get(claim_path(namespace, name), rate=CLAIMS_BUDGET)

    async def claim_for_status(self, namespace: str, name: str) -> Claim:
        """The claim again, for a status write: the driver's budget, after its slices."""
        return read_claim(await self.client.get(claim_path(namespace, name),
                                                priority=Priority.LOW))

    async def apply_claim_status(self, namespace: str, name: str, uid: str,
                                 entries: Sequence[DeviceEntry], field_manager: str
                                 ) -> Claim:
        """Server-side apply of ``entries`` to the claim's /status as ``field_manager`` (the
        driver's name): they become all that manager owns of ``status.devices``; other
        managers' entries stay. On the driver's budget, after its slices."""
        stored = await self.client.apply(
            claim_path(namespace, name) + "/status",
            apply_body(namespace, name, uid, entries, GROUP_VERSION),
            field_manager=field_manager, priority=Priority.LOW)
        return read_claim(stored)

    @property
    def tally(self) -> ApiTally:
        return self.client.tally
