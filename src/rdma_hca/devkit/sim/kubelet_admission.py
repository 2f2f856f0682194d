"""Pod admission as the kubelet does it: pick IDs, ask the plugin, checkpoint the answer."""

from __future__ import annotations

import grpc
import grpc.aio

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.devkit.sim.kubelet_checkpoint import CheckpointFile
from rdma_hca.devkit.sim.kubelet_records import Endpoint, PodDevices
from rdma_hca.devkit.sim.kubelet_rules import (
    HEALTHY,
    PRE_START_TIMEOUT,
    AdmissionError,
    rpc_error_text,
)


class PodAdmission(CheckpointFile):
    """The kubelet's calls into a registered plugin on behalf of pods."""

    _pod_serial: int

    async def _note(self, message: str) -> None:
        raise NotImplementedError

    def allocated(self, resource: str) -> set[str]:
        """Device IDs handed to containers and not released (restored from the checkpoint)."""
        return {i for pod in self._pods if pod.resource == resource for i in pod.ids}


    def _live_endpoint(self, resource: str) -> Endpoint:
        state = self._resources.get(resource)
        if state is None or state.endpoint is None:
            raise AdmissionError(
                f"unknown device plugin {resource}: no plugin is registered for it",
            )
        endpoint = state.endpoint
        if endpoint.ended or endpoint.closing:
            raise AdmissionError(
                f"endpoint for {resource} ({endpoint.target}) has been stopped: its ListAndWatch "
                "stream ended; the plugin must register again",
            )
        return endpoint

    async def allocate(
        self,
        resource: str,
        container_requests: list[list[str]],
        *,
        pod_uid: str | None = None,
    ) -> api_pb2.AllocateResponse:
        """Call Allocate with one container request per list and checkpoint the result."""
        endpoint = self._live_endpoint(resource)
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in container_requests
            ]
        )
        try:
            response = await endpoint.stub.Allocate(request)
        except grpc.aio.AioRpcError as err:
            await self._note(f"Allocate for {resource} failed: {rpc_error_text(err)}")
            raise AdmissionError(
                f"Allocate failed due to {rpc_error_text(err)}, which is unexpected",
                code=err.code(),
            ) from None
        if len(response.container_responses) != len(container_requests):
            await self._note(
                f"Allocate for {resource} returned {len(response.container_responses)} "
                f"container responses for {len(container_requests)} containers"
            )
            raise AdmissionError(
                f"Allocate failed due to the plugin returning {len(response.container_responses)}"
                f" container responses for {len(container_requests)} container requests, "
                "which is unexpected"
            )
        self._pod_serial += 1
        uid = pod_uid or f"emulated-pod-{self._pod_serial:05d}"
        for index, ids in enumerate(container_requests):
            self._pods.append(
                PodDevices(
                    uid, f"c{index}", resource, list(ids), response.container_responses[index]
                )
            )
        self._write_checkpoint()
        await self._note(
            f"allocated {resource} to pod {uid}: "
            + "; ".join(",".join(ids) for ids in container_requests)
        )
        return response

    async def get_preferred_allocation(
        self, resource: str, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        """Ask the plugin which ``size`` of ``available`` it prefers for one container."""
        endpoint = self._live_endpoint(resource)
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await endpoint.stub.GetPreferredAllocation(request)
        except grpc.aio.AioRpcError as err:
            await self._note(
                f"GetPreferredAllocation for {resource} failed: {rpc_error_text(err)}"
            )
            raise AdmissionError(
                f"Allocate failed due to device plugin GetPreferredAllocation rpc failed with "
                f"err: {rpc_error_text(err)}, which is unexpected",
                code=err.code(),
            ) from None
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def pre_start_container(self, resource: str, ids: list[str]) -> None:
        endpoint = self._live_endpoint(resource)
        try:
            await endpoint.stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=PRE_START_TIMEOUT
            )
        except grpc.aio.AioRpcError as err:
            await self._note(f"PreStartContainer for {resource} failed: {rpc_error_text(err)}")
            raise AdmissionError(
                f"device plugin PreStartContainer rpc failed with err: {rpc_error_text(err)}",
                reason="RunContainerError",
                code=err.code(),
            ) from None
        await self._note(f"PreStartContainer for {resource}: {','.join(ids)}")

    async def admit_pod(
        self,
        resource: str,
        count: int,
        *,
        pod_uid: str | None = None,
        start_container: bool = True,
    ) -> api_pb2.ContainerAllocateResponse:
        """Admit (and, by default, start) one container asking ``count`` of ``resource``.

        Picks healthy IDs not yet allocated, letting the plugin choose among them when it
        offers GetPreferredAllocation and there is a choice to make; then Allocate, and
        PreStartContainer if the plugin asked for it.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        state = self._resources.get(resource)
        if state is None or not state.devices:
            raise AdmissionError(
                f"Node didn't have enough resource: {resource}, requested: {count}, used: 0, "
                "capacity: 0",
                reason=f"OutOf{resource}",
            )
        available = self._free_healthy(resource)
        if len(available) < count:
            raise AdmissionError(
                f"Allocate failed due to requested number of devices unavailable for {resource}."
                f" Requested: {count}, Available: {len(available)}, which is unexpected"
            )
        endpoint = self._live_endpoint(resource)
        chosen: list[str] = []
        if endpoint.options.get_preferred_allocation_available and len(available) > count:
            preferred = await self.get_preferred_allocation(resource, available, [], count)
            chosen = self._accept_preferred(resource, preferred, available, count)
        chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        response = await self.allocate(resource, [chosen], pod_uid=pod_uid)
        if start_container and endpoint.options.pre_start_required:
            await self.pre_start_container(resource, chosen)
        return response.container_responses[0]

    async def release_pod(self, pod_uid: str) -> list[str]:
        """Forget a pod's devices, as the kubelet does once the pod is gone; returns the IDs."""
        freed = [i for pod in self._pods if pod.pod_uid == pod_uid for i in pod.ids]
        self._pods = [pod for pod in self._pods if pod.pod_uid != pod_uid]
        self._write_checkpoint()
        await self._note(f"released pod {pod_uid}: {','.join(freed) or 'no devices'}")
        return freed

    def _free_healthy(self, resource: str) -> list[str]:
        state = self._resources[resource]
        if not state.usable:
            return []
        taken = self.allocated(resource)
        return sorted(i for i, d in state.devices.items() if d.health == HEALTHY and i not in taken)

    def _accept_preferred(
        self, resource: str, preferred: list[str], available: list[str], count: int
    ) -> list[str]:
        """Keep what the kubelet keeps of a preference: offered IDs only, at most ``count``."""
        offered = set(available)
        stray = [i for i in preferred if i not in offered]
        if stray:
            self._record(
                f"GetPreferredAllocation for {resource} named IDs that were not offered; "
                f"ignored: {','.join(stray)}"
            )
        kept = list(dict.fromkeys(i for i in preferred if i in offered))
        if len(kept) > count:
            self._record(
                f"GetPreferredAllocation for {resource} returned {len(kept)} IDs for a request "
                f"of {count}; extra ignored"
            )
        return kept[:count]
