"""The broadcast value every ListAndWatch stream of a pool follows.

Each stream remembers the last generation it sent and waits for a newer one, so
one stream can never consume an update meant for another (a queue shared by
streams would hand each update to only one of them).

Waiting uses one ``asyncio.Event`` per generation, set when the next one is
published and then replaced. Unlike a Condition it holds no lock, so a stream
cancelled or timed out while waiting can never leave the publisher blocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rdma_hca.daemon.deviceplugin.pool import DeviceInfo
from rdma_hca.kit.aio import wait_event


class DeviceState:
    def __init__(self, devices: Sequence[DeviceInfo] = ()) -> None:
        self._devices: tuple[DeviceInfo, ...] = tuple(devices)
        self._generation = 0
        self._next = asyncio.Event()

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        return self._devices

    @property
    def generation(self) -> int:
        return self._generation

    def healthy_count(self) -> int:
        return sum(1 for d in self._devices if d.healthy)

    async def publish(self, devices: Sequence[DeviceInfo]) -> bool:
        """Store a new list; wake the streams only when it differs from the current one."""
        new = tuple(devices)
        if new == self._devices:
            return False
        self._devices = new
        self._generation += 1
        done, self._next = self._next, asyncio.Event()
        done.set()
        return True

    async def wait_newer(self, seen: int, timeout: float | None = None) -> int:
        """Return the current generation once it is newer than ``seen`` (or on timeout)."""
        if self._generation == seen:
            await wait_event(self._next, timeout)
        return self._generation
