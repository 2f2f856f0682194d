"""Allocate over the kubelet's socket hands out the env the offer builds, by default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from lifecycle_support import R, running, settings_for

from rdma_hca.daemon.offer import env as env_mod
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.sayonce import Once
from rdma_hca.settings.model import CdiConfig, NcclEnv

NINE = ",".join([*(f"mlx5_{i}:1" for i in range(8)), "mlx5_bond_0:1"])


async def test_the_default_env_on_the_host_network(node: SimNode, plugin_dir: Path,
                                                   kubelet: KubeletEmulator) -> None:
    settings = settings_for(node, plugin_dir)
    assert settings.nccl_env is NcclEnv.AUTO  # on by default
    async with running(settings):
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        resp = await kubelet.allocate(R, [["hca-0001"]])
    envs = dict(resp.container_responses[0].envs)
    assert envs == {
        "RDMA_HCA_DEVICES": "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,"
                            "mlx5_bond_0",
        "NCCL_IB_HCA": "=" + NINE,
        "NCCL_IB_GID_INDEX": "3",
        "UCX_NET_DEVICES": NINE,
        "NCCL_SOCKET_IFNAME": "=eth0,eth1,eth2,eth3,eth4,eth5,eth6,eth7,bond0",
    }


async def test_off_the_host_network_an_ipv4_node_gets_no_gid_choice(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_mod, "_SAID", Once(limit=1024))
    settings = settings_for(node, plugin_dir, non_host_network=True,
                            cdi=CdiConfig(enabled=True, spec_dir=str(node.root / "cdi")))
    with caplog.at_level(logging.WARNING, logger=env_mod.__name__):
        async with running(settings):
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
            first = await kubelet.allocate(R, [["hca-0001"]])
            await kubelet.allocate(R, [["hca-0002"]])
    envs = dict(first.container_responses[0].envs)
    # With CDI the devices travel as CDI names; the variables still come with Allocate.
    assert first.container_responses[0].cdi_devices
    assert envs["NCCL_IB_HCA"] == "=" + NINE and envs["UCX_NET_DEVICES"] == NINE
    assert not {"NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_SOCKET_IFNAME"} & set(envs)
    notes = [r.getMessage() for r in caplog.records
             if r.name == env_mod.__name__ and "global IPv6" in r.getMessage()]
    assert len(notes) == 1, notes


async def test_off_the_host_network_a_mixed_node_leaves_the_bond_out(
        tmp_path: Path, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """An IPv6 node whose bond has no global IPv6 GID: the eight others get the IPv6 GID."""
    from rdma_hca.devkit.sim.nodes import gpu_node

    monkeypatch.setattr(env_mod, "_SAID", Once(limit=1024))
    mixed = gpu_node(tmp_path / "mixed", ipv6=True, bond_ipv6=False, gid_table_size=8)
    settings = settings_for(mixed, plugin_dir, non_host_network=True)
    with caplog.at_level(logging.WARNING, logger=env_mod.__name__):
        async with running(settings):
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
            resp = await kubelet.allocate(R, [["hca-0001"]])
            await kubelet.allocate(R, [["hca-0002"]])
    envs = dict(resp.container_responses[0].envs)
    eight = ",".join(f"mlx5_{i}:1" for i in range(8))
    assert envs["RDMA_HCA_DEVICES"].endswith(",mlx5_bond_0")  # its device nodes still come
    assert envs["NCCL_IB_HCA"] == "=" + eight and envs["UCX_NET_DEVICES"] == eight
    assert envs["NCCL_IB_GID_INDEX"] == "5"  # the IPv6 RoCE v2 GID, after IPv4's at 3
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said == ["container env: mlx5_bond_0:1 left out of NCCL_IB_HCA and "
                    "UCX_NET_DEVICES: no RoCE v2 GID with a global IPv6 address, which "
                    "non-hostNetwork pods need (their RDMA goes over the node's IPv6 network); "
                    "the other HCAs get the IPv6 GID"]
