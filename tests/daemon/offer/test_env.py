"""The container env, built from what discovery reads on simulated nodes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rdma_hca.daemon.deviceplugin.pool import exclusive_ids, select
from rdma_hca.daemon.offer import env as env_mod
from rdma_hca.daemon.offer.env import EnvSettings, build, container_env
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.sayonce import Once
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import Hca
from rdma_hca.node.roce import AddrFamily, family_gid
from rdma_hca.settings.model import Mode, NcclEnv, PoolConfig

AUTO = EnvSettings(nccl=NcclEnv.AUTO)
AUTO_POD_NETWORK = EnvSettings(nccl=NcclEnv.AUTO, non_host_network=True)


def hcas_of(node: SimNode) -> tuple[Hca, ...]:
    return discover_node(node.sysfs_root, node.dev_root).hcas


def roce(tmp_path: Path, *hcas: sim.RoceHca) -> tuple[Hca, ...]:
    return hcas_of(sim.roce_node(tmp_path / "node", hcas))


def test_ipv4_only_takes_the_one_index_every_port_shares(tmp_path: Path) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"),
                sim.RoceHca("mlx5_1", ipv4="10.0.1.11"))
    assert build(hcas, AUTO).as_dict() == {
        "RDMA_HCA_DEVICES": "mlx5_0,mlx5_1",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_IB_GID_INDEX": "3",  # link-local v1/v2 at 0 and 1, the IPv4 v1 at 2
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1",
        "NCCL_SOCKET_IFNAME": "=eth0,eth1",
    }


def test_ipv4_only_off_the_host_network_refuses_to_guess(tmp_path: Path) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    got = build(hcas, AUTO_POD_NETWORK)
    assert got.as_dict() == {"RDMA_HCA_DEVICES": "mlx5_0", "NCCL_IB_HCA": "=mlx5_0:1",
                             "UCX_NET_DEVICES": "mlx5_0:1"}
    (note,) = got.notes
    assert "global IPv6" in note and "mlx5_0:1" in note and "not set" in note


@pytest.mark.parametrize("settings", [AUTO, AUTO_POD_NETWORK], ids=["host", "pod"])
def test_ipv6_only_uses_the_ipv6_gid(tmp_path: Path, settings: EnvSettings) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv6="2001:db8::11"),
                sim.RoceHca("mlx5_1", ipv6="2001:db8:1::11"))
    got = build(hcas, settings)
    assert got.as_dict()["NCCL_IB_GID_INDEX"] == "3"
    assert "NCCL_IB_ADDR_FAMILY" not in got.as_dict() and got.notes == ()
    # Off the host network the pod's own eth0 carries NCCL's sockets: not named.
    assert ("NCCL_SOCKET_IFNAME" in got.as_dict()) is (not settings.non_host_network)


def test_both_families_at_different_indices_give_the_family_not_an_index(
        tmp_path: Path) -> None:
    hcas = roce(tmp_path,
                sim.RoceHca("mlx5_0", ipv4="10.0.0.11", ipv6="2001:db8::11"),
                sim.RoceHca("mlx5_1", ipv4="10.0.1.11", ipv6="2001:db8:1::11",
                            ipv6_first=True))
    by_name = {h.name: h for h in hcas}
    v2 = {n: {g.kind.value: g.index for g in h.ports[0].gids if g.is_roce_v2}
          for n, h in by_name.items()}
    assert v2["mlx5_0"]["ipv4-mapped"] != v2["mlx5_1"]["ipv4-mapped"]  # the premise
    host = build(hcas, AUTO).as_dict()
    assert host["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
    assert host["NCCL_IB_ROCE_VERSION_NUM"] == "2"
    assert "NCCL_IB_GID_INDEX" not in host
    pod = build(hcas, AUTO_POD_NETWORK).as_dict()
    assert (pod["NCCL_IB_ADDR_FAMILY"], pod["NCCL_IB_ROCE_VERSION_NUM"]) == ("AF_INET6", "2")
    assert "NCCL_IB_GID_INDEX" not in pod


def test_one_ipv4_one_ipv6_port_has_no_common_family(tmp_path: Path) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"),
                sim.RoceHca("mlx5_1", ipv6="2001:db8:1::11"))
    got = build(hcas, AUTO)
    assert not {"NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY"} & set(got.as_dict())
    (note,) = got.notes
    assert "no IPv4 GID on mlx5_1:1" in note


def test_infiniband_gets_no_gid_choice(tmp_path: Path) -> None:
    got = build(hcas_of(sim.infiniband_node(tmp_path / "ib")), AUTO)
    assert got.as_dict() == {
        "RDMA_HCA_DEVICES": "mlx5_0",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_0:2",
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_0:2",
    }  # no NCCL_SOCKET_IFNAME: nothing says ib0 or ib1 holds an address
    assert got.notes == ()


def test_a_bonded_hca_names_the_bond_not_its_slaves(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "gpu", hcas=2, gid_table_size=16)
    (bond,) = [h for h in hcas_of(node) if h.name == "mlx5_bond_0"]
    got = build([bond], AUTO).as_dict()
    assert got["NCCL_IB_HCA"] == "=mlx5_bond_0:1"
    assert got["NCCL_SOCKET_IFNAME"] == "=bond0"
    assert got["NCCL_IB_GID_INDEX"] == "3"


def test_a_down_port_is_left_out_and_does_not_decide_the_gid(tmp_path: Path) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"),
                sim.RoceHca("mlx5_1", ipv6="2001:db8:1::11", up=False))
    got = build(hcas, AUTO)
    assert got.as_dict()["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert got.as_dict()["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert got.as_dict()["NCCL_SOCKET_IFNAME"] == "=eth0"
    # Only the up port counts, so its IPv4 GID index is the answer.
    assert got.as_dict()["NCCL_IB_GID_INDEX"] == "3" and got.notes == ()


def test_no_port_up_sets_no_nccl_variable(tmp_path: Path) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11", up=False))
    got = build(hcas, AUTO)
    assert got.as_dict() == {"RDMA_HCA_DEVICES": "mlx5_0"}
    assert got.notes == ("no port is up on mlx5_0: NCCL_IB_HCA is not set",)


def test_mlx5_1_beside_mlx5_10_is_named_exactly(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "gpu", hcas=11, bond=False, gid_table_size=16)
    view = select(PoolConfig(mode=Mode.EXCLUSIVE),
                  discover_node(node.sysfs_root, node.dev_root), env=AUTO)
    ids = exclusive_ids(view.hcas)
    envs = dict(view.allocate([ids["mlx5_1"]]).envs)
    assert envs["NCCL_IB_HCA"] == "=mlx5_1:1"  # "=": mlx5_10 is not a match
    assert envs["UCX_NET_DEVICES"] == "mlx5_1:1"
    assert envs["NCCL_SOCKET_IFNAME"] == "=eth1"  # not eth10 either
    both = dict(view.allocate([ids["mlx5_1"], ids["mlx5_10"]]).envs)
    assert both["NCCL_IB_HCA"] == "=mlx5_1:1,mlx5_10:1"


def test_allocate_hands_out_what_the_builder_builds(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "gpu", hcas=4, ipv6=True, gid_table_size=16)
    inventory = discover_node(node.sysfs_root, node.dev_root)
    for settings in (AUTO, AUTO_POD_NETWORK):
        view = select(PoolConfig(), inventory, env=settings)
        assert dict(view.allocate(["hca-0000"]).envs) == build(inventory.hcas,
                                                                settings).as_dict()


def test_hca_and_off_modes(tmp_path: Path) -> None:
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    assert build(hcas, EnvSettings(nccl=NcclEnv.HCA)).as_dict() == {
        "RDMA_HCA_DEVICES": "mlx5_0", "NCCL_IB_HCA": "=mlx5_0:1"}
    assert build(hcas, EnvSettings(nccl=NcclEnv.OFF)).as_dict() == {
        "RDMA_HCA_DEVICES": "mlx5_0"}
    assert build((), AUTO).as_dict() == {"RDMA_HCA_DEVICES": ""}


def test_a_note_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_mod, "_SAID", Once(limit=1024))
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    with caplog.at_level(logging.WARNING, logger=env_mod.__name__):
        for _ in range(3):
            container_env(hcas, AUTO_POD_NETWORK)
    lines = [r.getMessage() for r in caplog.records if "global IPv6" in r.getMessage()]
    assert len(lines) == 1


def test_a_mixed_ipv6_node_leaves_the_hca_without_ipv6_out_off_the_host_network(
        tmp_path: Path) -> None:
    """The bond has no global IPv6 GID, the other HCAs do: off the host network the bond is
    left out (as a down port is) and the others still get the IPv6 GID."""
    hcas = hcas_of(sim.gpu_node(tmp_path / "node", ipv6=True, bond_ipv6=False, hcas=4,
                                gid_table_size=16))
    assert [h.name for h in hcas][-1] == "mlx5_bond_0"
    got = build(hcas, AUTO_POD_NETWORK)
    env = got.as_dict()
    assert env["RDMA_HCA_DEVICES"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_bond_0"
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    # Every HCA left in has its IPv6 RoCE v2 GID at one index: that index is set.
    (index,) = {g.index for h in hcas[:4]
                if (g := family_gid(h.ports[0], AddrFamily.INET6)) is not None}
    assert env["NCCL_IB_GID_INDEX"] == str(index)
    assert family_gid(hcas[0].ports[0], AddrFamily.INET) is not None  # not IPv4's index
    assert index != family_gid(hcas[0].ports[0], AddrFamily.INET).index
    (note,) = got.notes
    assert note.startswith("mlx5_bond_0:1 left out of NCCL_IB_HCA and UCX_NET_DEVICES: no "
                           "RoCE v2 GID with a global IPv6 address")
    # On the host network IPv4 covers every port: nothing is left out.
    host = build(hcas, AUTO).as_dict()
    assert "mlx5_bond_0:1" in host["NCCL_IB_HCA"] and "mlx5_bond_0:1" in host["UCX_NET_DEVICES"]
    # ncclEnv: hca makes no GID choice, so there is nothing to leave an HCA out for.
    only = build(hcas, EnvSettings(nccl=NcclEnv.HCA, non_host_network=True)).as_dict()
    assert "mlx5_bond_0:1" in only["NCCL_IB_HCA"]


def test_a_node_with_no_ipv6_gid_at_all_keeps_its_hcas_and_sets_no_family(
        tmp_path: Path) -> None:
    """Nothing would remain: the HCAs stay listed and the GID variables are left unset."""
    hcas = roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"),
                sim.RoceHca("mlx5_1", ipv4="10.0.1.11"))
    got = build(hcas, AUTO_POD_NETWORK)
    assert got.as_dict()["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert "NCCL_IB_ADDR_FAMILY" not in got.as_dict()
    (note,) = got.notes
    assert "left out" not in note and "global IPv6" in note


def test_the_left_out_hca_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_mod, "_SAID", Once(limit=16))
    hcas = hcas_of(sim.gpu_node(tmp_path / "node", ipv6=True, bond_ipv6=False, hcas=2,
                                gid_table_size=16))
    with caplog.at_level(logging.WARNING, logger="rdma_hca.daemon.offer.env"):
        for _ in range(3):
            container_env(hcas, AUTO_POD_NETWORK)
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("container env: mlx5_bond_0:1 left out")
