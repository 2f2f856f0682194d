"""The plugin socket and the device-plugins directory: modes, replacement, absence."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_support import R, running, settings_for

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.daemon.deviceplugin.registration import State, socket_name
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
async def test_socket_mode_ignores_the_umask(node: SimNode, plugin_dir: Path,
                                             kubelet: KubeletEmulator) -> None:
    async with running(settings_for(node, plugin_dir)):
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        mode = stat.S_IMODE(os.stat(plugin_dir / socket_name(R)).st_mode)
        assert mode == 0o600, oct(mode)


class _HeldRegister(KubeletEmulator):
    """A kubelet that holds every Register after the first until ``release`` is set."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__(plugin_dir)
        self.release = asyncio.Event()
        self.calls = 0

    async def _admit_registration(self, request: api_pb2.RegisterRequest) -> Any:
        self.calls += 1
        if self.calls > 1:
            await self.release.wait()
        return await super()._admit_registration(request)


@pytest.mark.parametrize("how", ["replaced", "removed"])
async def test_a_replaced_or_removed_socket_is_served_again(
        node: SimNode, plugin_dir: Path, how: str) -> None:
    kubelet = _HeldRegister(plugin_dir)
    await kubelet.start()
    try:
        async with running(settings_for(node, plugin_dir)) as d:
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
            sock = plugin_dir / socket_name(R)
            sock.unlink()
            if how == "replaced":
                sock.write_text("not a socket")
            # Not ready while the new registration is held back; the socket is back.
            assert await wait_until(lambda: not d.ready() and sock.is_socket()
                                    and kubelet.calls == 2, 5)
            assert not d.ready()
            assert d.lifecycle.pools[R].state is State.REGISTERING
            kubelet.release.set()
            await kubelet.wait_for(lambda: kubelet.registrations(R) == 2
                                   and kubelet.allocatable(R) == 1000)
            assert await wait_until(d.ready, 5)
            assert d.lifecycle.pools[R].state is State.REGISTERED
            assert sock.is_socket()
    finally:
        await kubelet.stop()


async def test_a_missing_directory_is_said_once_then_waited_for(
        node: SimNode, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.INFO)
    plugin_dir = tmp_path / "k" / "dp"
    async with running(settings_for(node, plugin_dir)) as d:
        assert await wait_until(lambda: d.lifecycle.failed_passes >= 5, 10)  # several retries
        assert not d.ready()
        said = [r for r in caplog.records if "does not exist" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert said[0].levelno == logging.WARNING
        assert "is the kubelet running" in said[0].getMessage()
        assert "--kubelet-dir" in said[0].getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                    and r is not said[0]]
        plugin_dir.mkdir(parents=True)
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000, timeout=10)
        finally:
            await kubelet.stop()
    # gRPC's core never got to complain about a bind into a missing directory.
    assert "add_port" not in capfd.readouterr().err


async def test_a_socket_path_over_the_unix_limit_is_one_clear_line(
        node: SimNode, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    plugin_dir = tmp_path / ("d" * (120 - len(str(tmp_path))))
    plugin_dir.mkdir()
    async with running(settings_for(node, plugin_dir)) as d:
        assert await wait_until(lambda: d.lifecycle.failed_passes >= 3, 10)  # retried
        assert not d.ready()
    said = [r.getMessage() for r in caplog.records if "unix socket" in r.getMessage()]
    assert len(said) == 1 and "use a shorter --kubelet-dir" in said[0]
    assert "add_port" not in capfd.readouterr().err
