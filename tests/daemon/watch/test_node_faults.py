"""What the machine does to the daemon: fd exhaustion, flapping links, a vanished HCA,
a CDI spec removed behind its back. The real daemon runs in-process against a
simulated node and the kubelet emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import resource
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_daemon import R, make_settings

from rdma_hca.daemon.offer.cdi import SPEC_FILE
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.node.netlink import NetdevEvent
from rdma_hca.settings.model import CdiConfig


async def test_fd_exhaustion_during_discovery_keeps_the_last_state(
        node: SimNode, plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    first = await d.health.refresh()
    assert len(first.hcas) == 9
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    # Garbage left by earlier tests can hold descriptors (gRPC's epoll, eventfd and
    # socket pair of a finished test, say); a collection while we hold the rest would
    # close them and hand discovery free ones. Collect it now and none while they are held.
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        # Take every descriptor there is: each open() of discovery fails with EMFILE.
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (len(os.listdir("/proc/self/fd")) + 16, hard))
        with contextlib.suppress(OSError):
            while len(held) < 64:
                held.append(os.open(os.devnull, os.O_RDONLY))
        for _ in range(3):
            again = await d.health.refresh()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if collecting:
            gc.enable()
    assert [h.name for h in again.hcas] == [h.name for h in first.hcas]
    assert d.inventory is not None and len(d.inventory.hcas) == 9
    assert d.runtimes[0].state.healthy_count() == 1000
    assert d.status().discovery_errors == {"fd": 3}
    said = [r for r in caplog.records if "discovery failed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    await d.health.refresh()
    assert "discovery works again" in caplog.text


class Events:
    """A stand-in for rtnetlink: the test pushes events, the daemon reads them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[NetdevEvent] = asyncio.Queue()

    async def __call__(self) -> AsyncIterator[NetdevEvent]:
        while True:
            yield await self.queue.get()


async def test_a_flapping_link_is_coalesced_and_its_final_state_reaches_the_kubelet(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    # A poll of a minute: only the events can explain what the kubelet sees.
    d = Daemon(make_settings(node, plugin_dir, health_poll_seconds=60.0))
    events = Events()
    d.health.events = events
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        netdev = node.specs["mlx5_0"].ports[0].netdev
        state = d.runtimes[0].state
        before = (state.generation, d.health.passes)
        up = True
        for _ in range(151):
            up = not up
            node.set_port("mlx5_0", 1, up=up)
            events.queue.put_nowait(NetdevEvent("link", netdev))
            await asyncio.sleep(0.005)
        assert not up
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
        assert d.health.events_seen >= 151
        updates = state.generation - before[0]
        passes = d.health.passes - before[1]
        # Uncoalesced, each event is a pass and most passes an update.
        assert updates <= 30, f"{updates} stream updates for 151 link events"
        assert passes <= 30, f"{passes} passes for 151 link events"
        # The transitions the daemon saw are counted (for flapping alerts).
        assert d.status().state_changes[("mlx5_0", 1)] >= 1
        node.set_port("mlx5_0", 1, up=True)
        events.queue.put_nowait(NetdevEvent("link", netdev))
        # Back up, but held for flapping until it has been up for the hold time (the
        # hold's clock is moved by hand): then the kubelet sees it, with no event or poll.
        assert await wait_until(lambda: d.health.inventory is not None and any(
            h.name == "mlx5_0" and h.any_port_up for h in d.health.inventory.hcas), 5)
        assert d.health.inventory is not None and d.health.inventory.held == {"mlx5_0"}
        assert state.healthy_count() == 0 and kubelet.allocatable(R) == 0
        clock = d.health.flaps.clock
        d.health.flaps.clock = lambda: clock() + d.settings.flap_hold_seconds
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    finally:
        await d.stop()


async def test_a_vanished_hca_is_reported_missing_until_it_returns(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        assert d.status().pools[0].missing == ()
        assert d.status().pools[0].hcas == 9
        spec = node.specs["mlx5_5"]
        node.remove_hca("mlx5_5")
        assert await wait_until(lambda: d.status().pools[0].missing == ("mlx5_5",), 5)
        assert d.status().pools[0].hcas == 8
        node.add_hca(spec)
        assert await wait_until(lambda: d.status().pools[0].missing == (), 5)
    finally:
        await d.stop()


async def test_a_removed_or_changed_cdi_spec_is_written_again(
        node: SimNode, plugin_dir: Path, tmp_path: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture) -> None:
    cdi = tmp_path / "cdi"
    d = Daemon(make_settings(node, plugin_dir, cdi=CdiConfig(True, str(cdi))), netlink=False,
               cdi_check_seconds=0.05)
    await d.start()
    try:
        spec = cdi / SPEC_FILE
        assert await wait_until(spec.exists, 5)
        original = spec.read_text()
        spec.unlink()
        assert await wait_until(spec.exists, 5)
        assert spec.read_text() == original
        spec.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "x", "devices": []}))
        assert await wait_until(lambda: spec.read_text() == original, 5)
        # The file is back as soon as the writing thread renamed it; the warning follows
        # once the loop resumes the task that waited for that thread.
        assert await wait_until(
            lambda: caplog.text.count("was removed or changed; written again") >= 2, 5)
    finally:
        await d.stop()



async def test_a_failing_event_source_is_logged_and_polling_goes_on(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> AsyncIterator[NetdevEvent]:
        raise RuntimeError("the event source broke")
        yield NetdevEvent("link", None)  # an async generator, never reached

    d = Daemon(make_settings(node, plugin_dir))
    d.health.events = broken
    await d.start()
    try:
        assert await wait_until(lambda: "rtnetlink watcher failed" in caplog.text, 5)
        assert "the event source broke" in caplog.text
        node.set_port("mlx5_1", 1, up=False)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
        assert not d.failed
    finally:
        await d.stop()


async def test_a_port_that_moves_during_a_full_reread_is_applied_the_quick_way_next(
        node: SimNode, plugin_dir: Path) -> None:
    d = Daemon(make_settings(node, plugin_dir, health_poll_seconds=60.0), netlink=False)
    await d.health.refresh()
    discover = d.reader.discover
    full_rereads = 0

    async def port_goes_down_meanwhile() -> object:
        nonlocal full_rereads
        full_rereads += 1
        inventory = await discover()
        if full_rereads == 1:
            node.set_port("mlx5_0", 1, up=False)  # after discovery read it, before the check
        return inventory

    d.reader.discover = port_goes_down_meanwhile  # type: ignore[method-assign]
    stale = await d.health.refresh()
    assert [p.is_up for p in stale.hcas[0].ports] == [True]  # read before the change
    # The next pass publishes the new state without another full re-read...
    assert await d.health._check(due=False) is False
    assert full_rereads == 1
    assert d.inventory is not None and not d.inventory.hcas[0].ports[0].is_up
    assert d.runtimes[0].state.healthy_count() == 0
    # ...and the full one follows once the port has settled.
    assert d.health._full_at is not None
