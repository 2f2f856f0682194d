"""The driver's few API server calls, through lightkube's async client, as plain dicts.

lightkube (and its models) is imported only when the driver starts: a daemon that runs
only the device plugin never pays for it. Credentials: a kubeconfig file when one is
given, else in-cluster service account, else ``KUBECONFIG``/``~/.kube/config``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightkube import AsyncClient


class KubeApiError(Exception):
    """An API call failed; ``status`` is the HTTP code (0 when there was no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _connect(kubeconfig: str | None, timeout: float) -> AsyncClient:
    import httpx2
    from lightkube import AsyncClient, KubeConfig

    # httpx logs every request at INFO: a line per slice write is noise in a node daemon.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else None
    return AsyncClient(config=config, timeout=httpx2.Timeout(timeout), lazy=False,
                       field_manager="rdma-hca")


class SliceApi:
    """ResourceSlices of one driver on one node, and reading ResourceClaims."""

    def __init__(self, client: AsyncClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    @classmethod
    async def connect(cls, kubeconfig: str | None, timeout: float) -> SliceApi:
        """Read credentials (files: off the event loop) and make the client."""
        try:
            client = await asyncio.to_thread(_connect, kubeconfig, timeout)
        except Exception as exc:
            raise KubeApiError(f"no usable API server credentials: {exc}") from exc
        return cls(client, timeout)

    async def close(self) -> None:
        await self._client.close()

    async def _call(self, what: str, coro: Any) -> Any:
        from lightkube import ApiError

        try:
            return await asyncio.wait_for(coro, self._timeout)
        except ApiError as exc:
            code = int(exc.status.code or 0)
            raise KubeApiError(f"{what}: {exc.status.message or exc} (HTTP {code})",
                               code) from exc
        except TimeoutError as exc:
            raise KubeApiError(f"{what}: no answer within {self._timeout:g} s") from exc
        except OSError as exc:
            raise KubeApiError(f"{what}: {exc}") from exc
        except Exception as exc:
            # httpx transport errors and decoding errors: one line, never a traceback.
            raise KubeApiError(f"{what}: {type(exc).__name__}: {exc}") from exc

    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        from lightkube.resources.resource_v1 import ResourceSlice

        async def collect() -> list[dict[str, Any]]:
            fields: dict[str, Any] = {"spec.nodeName": node, "spec.driver": driver}
            return [s.to_dict() async for s in self._client.list(ResourceSlice, fields=fields)]

        found: list[dict[str, Any]] = await self._call("listing ResourceSlices", collect())
        # The field selector already did this; a server that ignored it must not make us
        # touch another node's slices.
        return [s for s in found
                if s.get("spec", {}).get("nodeName") == node
                and s.get("spec", {}).get("driver") == driver]

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        created = await self._call("creating a ResourceSlice",
                                   self._client.create(ResourceSlice.from_dict(obj)))
        result: dict[str, Any] = created.to_dict()
        return result

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        name = obj["metadata"]["name"]
        replaced = await self._call(f"updating ResourceSlice {name}",
                                    self._client.replace(ResourceSlice.from_dict(obj)))
        result: dict[str, Any] = replaced.to_dict()
        return result

    async def delete_slice(self, name: str) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        try:
            await self._call(f"deleting ResourceSlice {name}",
                             self._client.delete(ResourceSlice, name))
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceClaim

        claim = await self._call(f"reading ResourceClaim {namespace}/{name}",
                                 self._client.get(ResourceClaim, name, namespace=namespace))
        result: dict[str, Any] = claim.to_dict()
        return result
