"""The reads ``doctor`` makes of the cluster, through the one API client (rdma_hca.kube).

doctor is a command, not a daemon: each read runs the client on a private event loop and
returns plain JSON-shaped dictionaries. Every failure is a :class:`KubeError` whose message
says what went wrong and how to fix it; callers print it as one line.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from rdma_hca.contract.dra import GROUP_VERSION
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import Credentials, CredentialSearch, label_selector
from rdma_hca.kube.errors import NotFoundError
from rdma_hca.kube.policy import ClientPolicy

DEFAULT_TIMEOUT = 10.0
# doctor's own flags, which its credential messages name (kubectl's order otherwise).
KUBECONFIG_FLAG, CONTEXT_FLAG = "--kubeconfig", "--context"
CREDENTIALS = CredentialSearch(kubeconfig_flag=KUBECONFIG_FLAG, context_flag=CONTEXT_FLAG)
T = TypeVar("T")


class KubeClient:
    """The reads ``doctor`` makes, as plain JSON-shaped dictionaries."""

    def __init__(self, creds: Credentials, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        # One deadline for a read and its retries: doctor's --timeout is what a user waits.
        self._api = ApiClient(creds, ClientPolicy(timeout=timeout, budget=timeout))
        self._loop = asyncio.new_event_loop()

    @property
    def server(self) -> str:
        return self._api.server

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._api.close())
            self._loop.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(work)

    def _items(self, path: str, params: Mapping[str, str] | None = None
               ) -> list[dict[str, Any]]:
        found = self._run(self._api.get(path, params))
        return [i for i in found.get("items") or [] if isinstance(i, dict)]

    def daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The DaemonSet, or None when it does not exist."""
        try:
            return self._run(self._api.get(
                f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"))
        except NotFoundError:
            return None

    def nodes(self) -> list[dict[str, Any]]:
        return self._items("/api/v1/nodes")

    def node(self, name: str) -> dict[str, Any]:
        return self._run(self._api.get(f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}"))

    def pods(self, namespace: str, selector: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pods of ``namespace`` that match a LabelSelector object."""
        labels = label_selector(selector)
        return self._items(f"/api/v1/namespaces/{namespace}/pods",
                           {"labelSelector": labels} if labels else None)

    def resource_slices(self, driver: str) -> list[dict[str, Any]]:
        """Every ResourceSlice (resource.k8s.io/v1) of ``driver``, on all nodes."""
        found = self._items(f"/apis/{GROUP_VERSION}/resourceslices",
                            {"fieldSelector": f"spec.driver={driver}"})
        # The field selector did this already; a server that ignored it must not make
        # another driver's slices look like ours.
        return [s for s in found if (s.get("spec") or {}).get("driver") == driver]

    def device_classes(self) -> list[dict[str, Any]]:
        return self._items(f"/apis/{GROUP_VERSION}/deviceclasses")

    def resource_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim, in all namespaces."""
        return self._items(f"/apis/{GROUP_VERSION}/resourceclaims")

    def resource_claim_templates(self) -> list[dict[str, Any]]:
        """Every ResourceClaimTemplate, in all namespaces."""
        return self._items(f"/apis/{GROUP_VERSION}/resourceclaimtemplates")
