"""Non-hostNetwork readiness on simulated nodes: IPv4, IPv6, mixed, InfiniBand, netns mode.

The daemon keeps serving in every case; what changes is what it tells the operator
(once, in the log), the ipv6_ready metric, and the reasons doctor --node shows.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.nodes import gpu_node, infiniband_node
from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.roce import ipv6_missing
from rdma_hca.settings.model import Settings


def settings_for(node: SimNode, non_host_network: bool) -> Settings:
    return Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                    kubelet_dir="/nonexistent", metrics_address="",
                    non_host_network=non_host_network)


async def judged(d: Daemon) -> None:
    """One health pass, then the node's judgement of it (a follower of the watcher's)."""
    await d.node_judge.judge(await d.health.refresh())


def mixed_node(root: Path) -> SimNode:
    specs = [
        HcaSpec(name=f"mlx5_{i}", pci_address=f"0000:{0x10 + i:02x}:00.0", uverbs_index=i,
                node_guid=f"b859:9f03:00d4:3c{i:02x}",
                ports=(PortSpec(netdev=f"eth{i}", ipv4=f"10.0.0.{i + 1}",
                                ipv6=f"2001:db8::{i + 1}" if i % 2 == 0 else None,
                                gid_table_size=16),))
        for i in range(4)
    ]
    return build_node(root, specs)


@pytest.mark.parametrize(
    ("builder", "missing"),
    [
        (lambda r: gpu_node(r, gid_table_size=16), [f"mlx5_{i}" for i in range(8)]
         + ["mlx5_bond_0"]),
        (lambda r: gpu_node(r, ipv6=True, gid_table_size=16), []),
        (mixed_node, ["mlx5_1", "mlx5_3"]),
        (infiniband_node, []),
    ],
    ids=["ipv4-only", "ipv6", "mixed", "infiniband"],
)
async def test_ipv6_readiness(tmp_path: Path, builder: object, missing: list[str],
                              caplog: pytest.LogCaptureFixture) -> None:
    node = builder(tmp_path / "n")  # type: ignore[operator]
    assert ipv6_missing(discover_node(node.sysfs_root, node.dev_root).hcas) == missing
    caplog.set_level(logging.WARNING, logger="rdma_hca.daemon.findings")
    d = Daemon(settings_for(node, True), netlink=False)
    await judged(d)
    assert list(d.node_judge.findings.ipv6_missing) == missing
    assert d.node_judge.findings.ipv6_ready is (not missing)
    warned = [r.getMessage() for r in caplog.records if "global IPv6" in r.getMessage()]
    assert len(warned) == (1 if missing else 0)
    if missing:
        assert all(name in warned[0] for name in missing)
        assert "hostNetwork pods still can" in warned[0]
    # Said once: a second pass over an unchanged node logs nothing new.
    await judged(d)
    assert len([r for r in caplog.records if "global IPv6" in r.getMessage()]) == len(warned)


async def test_switch_off_means_no_ipv6_requirement(tmp_path: Path) -> None:
    node = gpu_node(tmp_path / "n", gid_table_size=16)
    d = Daemon(settings_for(node, False), netlink=False)
    await judged(d)
    assert d.node_judge.findings.ipv6_missing == ()
    assert d.node_judge.findings.messages() == []


async def test_exclusive_netns_is_explained_not_fatal(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    node = gpu_node(tmp_path / "n", ipv6=True, gid_table_size=16)
    node.set_netns_mode("exclusive")
    caplog.set_level(logging.WARNING, logger="rdma_hca.daemon.findings")
    d = Daemon(settings_for(node, True), netlink=False)
    await judged(d)
    assert d.node_judge.findings.netns_mode == "exclusive"
    (msg,) = d.node_judge.findings.messages()
    assert "netns mode is exclusive" in msg and "rdma system set netns shared" in msg
    assert any("netns mode is exclusive" in r.getMessage() for r in caplog.records)
    # The pool still serves hostNetwork pods.
    assert all(dev.healthy for dev in d.runtimes[0].state.devices)


async def test_readiness_change_is_logged_when_it_happens(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = gpu_node(tmp_path / "n", ipv6=True, gid_table_size=16)
    caplog.set_level(logging.INFO, logger="rdma_hca.daemon.findings")
    d = Daemon(replace(settings_for(node, True)), netlink=False)
    await judged(d)
    assert d.node_judge.findings.ipv6_ready
    spec = node.specs["mlx5_2"]
    node.remove_hca("mlx5_2")
    node.add_hca(replace(spec, ports=(replace(spec.ports[0], ipv6=None),)))
    await judged(d)
    assert d.node_judge.findings.ipv6_missing == ("mlx5_2",)
    assert sum("mlx5_2" in r.getMessage() for r in caplog.records) == 1
