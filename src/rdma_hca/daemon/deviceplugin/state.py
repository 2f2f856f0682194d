"""The device list every ListAndWatch stream of a pool follows (a broadcast value).

Each stream follows it at its own pace (``kit.broadcast``), so one stream never consumes
an update meant for another and a slow stream holds no other back.
"""

from __future__ import annotations

from collections.abc import Sequence

from rdma_hca.daemon.deviceplugin.pool import DeviceInfo
from rdma_hca.kit.broadcast import Broadcast


class DeviceState(Broadcast[tuple[DeviceInfo, ...]]):
    def __init__(self, devices: Sequence[DeviceInfo] = ()) -> None:
        super().__init__(tuple(devices))

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        return self.value

    def healthy_count(self) -> int:
        return sum(1 for d in self.value if d.healthy)

    async def update(self, devices: Sequence[DeviceInfo]) -> bool:
        """Store a new list; wake the streams only when it differs from the current one."""
        return self.publish(tuple(devices))
