"""A link event makes a running ``rdma-hca serve`` re-read port state at once.

The daemon runs inside a network namespace the test creates, beside a veth pair whose
names are the netdevs of the simulated HCA; the poll interval is 60 s, so only the
rtnetlink event can explain a change the kubelet sees within seconds. Everything
happens inside that namespace; the host's interfaces are never touched. Needs root
and ``ip netns``; skipped otherwise.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
from test_serve_process import R, serve, serve_argv, wait_registered

from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node

VETH = "rhv0"
PEER = "rhv0p"


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10,
                          check=False)


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace holding an up veth pair; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("needs the ip command (iproute2) for ip netns")
    name = f"rdmahca-test-{os.getpid()}"
    made = ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"ip netns is unavailable here: {made.stderr.strip()}")
    try:
        # No IPv6 link-local addresses: the kernel would add them a moment (DAD) after the
        # links come up, and such a late address event makes the daemon re-read the node
        # while the test means it to see nothing.
        for args in (("link", "add", VETH, "type", "veth", "peer", "name", PEER),
                     ("link", "set", VETH, "addrgenmode", "none"),
                     ("link", "set", PEER, "addrgenmode", "none"),
                     ("link", "set", VETH, "up"), ("link", "set", PEER, "up")):
            done = ip("-n", name, *args)
            assert done.returncode == 0, f"ip -n {name} {' '.join(args)}: {done.stderr}"
        yield name
    finally:
        ip("netns", "del", name)


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    spec = HcaSpec(name="mlx5_0", pci_address="0000:0c:00.0", uverbs_index=0,
                   ports=(PortSpec(netdev=VETH, ipv4="10.99.0.1", gid_table_size=8),))
    return build_node(tmp_path / "node", [spec])


@pytest.mark.slow
async def test_link_event_prompts_an_immediate_reread(netns: str, node: SimNode,
                                                      tmp_path: Path) -> None:
    plugin_dir = tmp_path / "dp"
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    argv = ["ip", "netns", "exec", netns,
            *serve_argv(node, plugin_dir, "--log-level", "debug", poll="60")]
    try:
        async with serve(argv) as proc:
            def log() -> str:
                # Every failure shows what the daemon heard and did, in order.
                return "\nthe daemon's log:\n" + proc.stderr

            async def reaches(wait: Awaitable[None]) -> None:
                try:
                    await wait
                except TimeoutError as exc:
                    raise AssertionError(f"{exc}{log()}") from None

            await reaches(wait_registered(kubelet))

            # The daemon subscribes to link events after it starts; nudge the link
            # (an MTU change is a link event too) until it reports hearing one.
            def heard(start: int) -> bool:
                return any(f"link event on {VETH}" in line for line in proc.lines[start:])

            for mtu in range(1400, 1500):
                mark = len(proc.lines)
                assert ip("-n", netns, "link", "set", VETH, "mtu", str(mtu)).returncode == 0
                for _ in range(10):
                    await asyncio.sleep(0.05)
                    if heard(mark):
                        break
                if heard(mark):
                    break
            assert heard(0), "the daemon never reported a link event:\n" + proc.stderr

            # Let the namespace settle: a nudge may still bring a coalesced re-read, and the
            # kernel adds addresses (IPv6 link-local after DAD) a moment after a link
            # change, each an event. Go on after a quiet second and a half.
            for _ in range(10):
                mark = len(proc.lines)
                await asyncio.sleep(1.5)
                if not any(" event on " in line for line in proc.lines[mark:]):
                    break
            # The port file alone changes nothing for a minute: that is the poll.
            node.set_port("mlx5_0", 1, up=False)
            await asyncio.sleep(0.5)
            assert kubelet.allocatable(R) == 1000, "a port file alone was seen" + log()

            # The link going down is what makes the daemon look again, at once.
            mark = len(proc.lines)
            assert ip("-n", netns, "link", "set", VETH, "down").returncode == 0
            await reaches(kubelet.wait_for(lambda: kubelet.allocatable(R) == 0, timeout=10))
            assert heard(mark), "the link going down was not heard" + log()
            assert kubelet.capacity(R) == 1000

            node.set_port("mlx5_0", 1, up=True)
            assert ip("-n", netns, "link", "set", VETH, "up").returncode == 0
            await reaches(kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000, timeout=10))

            # An event for a netdev that is not an HCA's is not reported as one of ours.
            mark = len(proc.lines)
            assert ip("-n", netns, "link", "set", PEER, "mtu", "1300").returncode == 0
            assert ip("-n", netns, "link", "set", VETH, "mtu", "1280").returncode == 0
            async with asyncio.timeout(10):
                while not heard(mark):
                    await asyncio.sleep(0.05)
            assert not any(f"link event on {PEER}" in line for line in proc.lines), log()

            proc.send(signal.SIGTERM)
            assert await proc.wait_exit() == 0, log()
        assert "rtnetlink events" not in proc.stderr  # neither unavailable nor stopped
    finally:
        await kubelet.stop()
