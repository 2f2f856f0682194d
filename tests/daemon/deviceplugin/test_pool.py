"""Pools: selection, device IDs, health verdicts, Allocate and preferred allocation.

These run on hand-built records so that each verdict is checked against exactly the
input that should produce it; the simulated-node tests cover discovery feeding in.
"""

from __future__ import annotations

import pytest

from rdma_hca.daemon.deviceplugin.pool import (
    UnknownDeviceIds,
    exclusive_ids,
    natural_key,
    select,
    shared_ids,
)
from rdma_hca.daemon.offer.env import EnvSettings
from rdma_hca.node.model import CharDevice, Hca, LinkLayer, NodeInventory, Port
from rdma_hca.settings.model import Mode, NcclEnv, PoolConfig, Selectors, UnhealthyWhen

HCA_ONLY = EnvSettings(nccl=NcclEnv.HCA)

RDMA_CM = CharDevice("rdma_cm", "/dev/infiniband/rdma_cm", True)


def port(up: bool = True, link: LinkLayer = LinkLayer.ETHERNET, n: int = 1,
         netdev: str = "eth0", umad: int | None = None) -> Port:
    return Port(
        number=n, state="ACTIVE" if up else "DOWN", phys_state="LinkUp" if up else "Disabled",
        link_layer=link, rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, netdevs=(netdev,),
        gids=(),
        umad=CharDevice(f"umad{umad}", f"/dev/infiniband/umad{umad}", True)
        if umad is not None else None,
    )


def hca(name: str, uverbs: int, *, numa: int | None = 0, up: bool = True,
        pci: str | None = None, present: bool = True, ports: tuple[Port, ...] | None = None,
        driver: str = "mlx5_core") -> Hca:
    return Hca(
        name=name, driver=driver, node_guid=None, fw_ver=None, board_id=None, hca_type=None,
        pci_address=pci, pci_vendor="0x15b3", pci_device="0x101d", numa_node=numa,
        ports=ports if ports is not None else (port(up, netdev=f"eth{uverbs}"),),
        uverbs=CharDevice(f"uverbs{uverbs}", f"/dev/infiniband/uverbs{uverbs}", present),
    )


def inv(*hcas: Hca, rdma_cm: CharDevice | None = RDMA_CM) -> NodeInventory:
    return NodeInventory(hcas=hcas, rdma_cm=rdma_cm, netns_mode="shared")


def gpu_hcas() -> list[Hca]:
    # uverbs numbers deliberately out of name order, as on real nodes
    return [hca(f"mlx5_{i}", (i * 3) % 8, numa=i // 4, pci=f"0000:{0x1a + i:02x}:00.0")
            for i in range(8)]


def test_shared_pool_has_1000_stable_ids_all_healthy() -> None:
    view = select(PoolConfig(), inv(*gpu_hcas()))
    devices = view.devices()
    assert len(devices) == 1000
    assert len({d.id for d in devices}) == 1000
    assert all(d.healthy for d in devices)
    assert [d.id for d in devices] == shared_ids(1000)
    assert devices[0].id == "hca-0000" and devices[-1].id == "hca-0999"
    assert all(len(d.id) <= 63 for d in devices)
    # HCAs on two NUMA nodes: a shared device must carry no topology hint
    assert devices[0].numa_nodes == ()


def test_shared_topology_only_when_one_numa_node() -> None:
    view = select(PoolConfig(rdma_hca_max=3), inv(hca("mlx5_0", 0, numa=1),
                                                  hca("mlx5_1", 1, numa=1)))
    assert {d.numa_nodes for d in view.devices()} == {(1,)}
    view = select(PoolConfig(rdma_hca_max=3), inv(hca("mlx5_0", 0, numa=None)))
    assert {d.numa_nodes for d in view.devices()} == {()}


def test_unhealthy_when_any_and_all() -> None:
    hcas = gpu_hcas()
    hcas[3] = hca("mlx5_3", 1, up=False)
    any_view = select(PoolConfig(rdma_hca_max=5), inv(*hcas))
    assert not any(d.healthy for d in any_view.devices())
    assert any("mlx5_3: no port is up" in p for p in any_view.problems())
    all_view = select(PoolConfig(rdma_hca_max=5, unhealthy_when=UnhealthyWhen.ALL), inv(*hcas))
    assert all(d.healthy for d in all_view.devices())
    none_up = [hca(h.name, i, up=False) for i, h in enumerate(hcas)]
    all_down = select(PoolConfig(rdma_hca_max=5, unhealthy_when=UnhealthyWhen.ALL),
                      inv(*none_up))
    assert not any(d.healthy for d in all_down.devices())


def test_a_pool_without_hcas_advertises_nothing_and_no_rdma_cm_is_unhealthy() -> None:
    empty = select(PoolConfig(rdma_hca_max=4), inv())
    # Not 4 Unhealthy devices: a capacity the node can never allocate is only noise.
    assert empty.devices() == []
    assert "no RDMA HCA matches" in empty.problems()[0]
    no_cm = select(PoolConfig(rdma_hca_max=4), inv(*gpu_hcas(), rdma_cm=None))
    assert not any(d.healthy for d in no_cm.devices())
    assert any("rdma_cm is missing" in p for p in no_cm.problems())


def test_missing_device_node_is_never_advertised_as_working() -> None:
    hcas = gpu_hcas()
    hcas[2] = hca("mlx5_2", 6, present=False)
    view = select(PoolConfig(rdma_hca_max=2), inv(*hcas))
    assert not any(d.healthy for d in view.devices())
    resp = view.allocate(["hca-0000"])
    paths = [d.host_path for d in resp.devices]
    assert "/dev/infiniband/uverbs6" not in paths
    assert "mlx5_2" not in dict(resp.envs)["RDMA_HCA_DEVICES"].split(",")


def test_shared_allocate_gives_rdma_cm_and_every_uverbs() -> None:
    view = select(PoolConfig(), inv(*gpu_hcas()))
    resp = view.allocate(["hca-0007"])
    paths = [d.container_path for d in resp.devices]
    assert paths[0] == "/dev/infiniband/rdma_cm"
    assert sorted(paths[1:]) == sorted(f"/dev/infiniband/uverbs{(i * 3) % 8}" for i in range(8))
    assert all(d.host_path == d.container_path and d.permissions == "rw" for d in resp.devices)
    assert dict(resp.envs)["RDMA_HCA_DEVICES"] == ",".join(f"mlx5_{i}" for i in range(8))
    assert "NCCL_IB_HCA" not in dict(resp.envs)


def test_infiniband_ports_add_umad_roce_ports_do_not() -> None:
    ib = hca("mlx5_0", 0, ports=(port(link=LinkLayer.INFINIBAND, n=1, umad=0),
                                 port(link=LinkLayer.INFINIBAND, n=2, umad=1)))
    roce = hca("mlx5_1", 1, ports=(port(umad=2),))
    resp = select(PoolConfig(), inv(ib, roce)).allocate(["hca-0001"])
    paths = {d.container_path for d in resp.devices}
    assert {"/dev/infiniband/umad0", "/dev/infiniband/umad1"} <= paths
    assert "/dev/infiniband/umad2" not in paths


def test_nccl_env_is_an_exact_list() -> None:
    view = select(PoolConfig(), inv(hca("mlx5_1", 0), hca("mlx5_10", 1)), env=HCA_ONLY)
    assert dict(view.allocate(["hca-0000"]).envs)["NCCL_IB_HCA"] == "=mlx5_1:1,mlx5_10:1"


def test_unknown_ids_are_named() -> None:
    view = select(PoolConfig(rdma_hca_max=10), inv(*gpu_hcas()))
    with pytest.raises(UnknownDeviceIds) as err:
        view.allocate(["hca-0001", "hca-0010", "bogus"])
    assert err.value.ids == ("hca-0010", "bogus")
    assert "hca-0010, bogus" in str(err.value)


def test_selectors_compare_names_exactly() -> None:
    hcas = [hca("mlx5_1", 0), hca("mlx5_10", 1), hca("mlx5_11", 2)]
    view = select(PoolConfig(selectors=Selectors(names=("mlx5_1",))), inv(*hcas))
    assert [h.name for h in view.hcas] == ["mlx5_1"]
    view = select(PoolConfig(selectors=Selectors(names=("mlx5_1*",))), inv(*hcas))
    assert [h.name for h in view.hcas] == ["mlx5_1", "mlx5_10", "mlx5_11"]


def test_selectors_by_driver_link_layer_netdev_and_pci() -> None:
    ib = hca("mlx5_0", 0, ports=(port(link=LinkLayer.INFINIBAND, netdev="ib0"),))
    erdma = hca("erdma_0", 1, driver="erdma")
    roce = hca("mlx5_1", 2)
    everything = inv(ib, erdma, roce)
    pick = lambda **kw: [h.name for h in select(  # noqa: E731
        PoolConfig(selectors=Selectors(**kw)), everything).hcas]
    assert pick(drivers=("erdma",)) == ["erdma_0"]
    assert pick(link_layers=("InfiniBand",)) == ["mlx5_0"]
    assert pick(link_layers=("ethernet",)) == ["erdma_0", "mlx5_1"]
    assert pick(netdevs=("ib*",)) == ["mlx5_0"]
    assert pick(pci_vendors=("15B3",)) == ["mlx5_0", "erdma_0", "mlx5_1"]
    assert pick(pci_devices=("0x1017",)) == []


def test_exclusive_ids_are_pci_addresses_with_topology_and_own_health() -> None:
    hcas = gpu_hcas()
    hcas[5] = hca("mlx5_5", 7, numa=1, pci="0000:1f:00.0", up=False)
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*hcas))
    devices = {d.id: d for d in view.devices()}
    assert set(devices) == {f"0000:{0x1a + i:02x}:00.0" for i in range(8)}
    assert devices["0000:1a:00.0"].numa_nodes == (0,)
    assert devices["0000:1e:00.0"].numa_nodes == (1,)
    assert devices["0000:1f:00.0"].healthy is False
    assert sum(d.healthy for d in devices.values()) == 7


def test_exclusive_ids_fall_back_to_names() -> None:
    ids = exclusive_ids([hca("rxe0", 0, pci=None), hca("mlx5_0", 1, pci="0000:01:00.0"),
                         hca("mlx5_bond_0", 2, pci="0000:01:00.0")])
    assert ids == {"rxe0": "rxe0", "mlx5_0": "mlx5_0", "mlx5_bond_0": "mlx5_bond_0"}


def test_exclusive_allocate_only_the_allocated_hcas() -> None:
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*gpu_hcas()))
    resp = view.allocate(["0000:1b:00.0", "0000:1d:00.0"])
    assert dict(resp.envs)["RDMA_HCA_DEVICES"] == "mlx5_1,mlx5_3"
    assert [d.container_path for d in resp.devices] == [
        "/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs3", "/dev/infiniband/uverbs1"]


@pytest.mark.parametrize("size", range(1, 9))
def test_preferred_allocation_fewest_numa_nodes(size: int) -> None:
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*gpu_hcas()))
    ids = exclusive_ids(view.hcas)
    numa = {ids[h.name]: h.numa_node for h in view.hcas}
    available = sorted(numa)
    got = view.preferred(available, [], size)
    assert len(got) == size and len(set(got)) == size
    assert len({numa[i] for i in got}) == (1 if size <= 4 else 2)
    assert got == view.preferred(list(reversed(available)), [], size)  # deterministic


@pytest.mark.parametrize("size", range(1, 9))
def test_preferred_allocation_honours_must_include(size: int) -> None:
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*gpu_hcas()))
    ids = exclusive_ids(view.hcas)
    numa = {ids[h.name]: h.numa_node for h in view.hcas}
    must = [ids["mlx5_6"]]  # on NUMA node 1
    got = view.preferred(sorted(numa), must, size)
    assert got[0] == ids["mlx5_6"]
    assert len(got) == size
    if size <= 4:
        assert {numa[i] for i in got} == {1}


def test_natural_order() -> None:
    assert sorted(["mlx5_10", "mlx5_2", "mlx5_1"], key=natural_key) == [
        "mlx5_1", "mlx5_2", "mlx5_10"]


def test_preferred_allocation_takes_hcas_in_name_order_within_a_numa_node() -> None:
    hcas = [hca("mlx5_10", 0, numa=0, pci="0000:0a:00.0"),
            hca("mlx5_2", 1, numa=0, pci="0000:1b:00.0")]
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*hcas))
    assert view.preferred(["0000:0a:00.0", "0000:1b:00.0"], [], 1) == ["0000:1b:00.0"]


class _CountedId(str):
    """A device ID that counts how often it is hashed: a measure of work, not of time."""

    hashes = 0

    def __hash__(self) -> int:
        _CountedId.hashes += 1
        return str.__hash__(self)


@pytest.mark.parametrize("mode", [Mode.SHARED, Mode.EXCLUSIVE])
def test_preferred_allocation_is_linear_in_its_input(mode: Mode) -> None:
    # Long lists of available and must-include IDs, as a hostile client may send: the
    # work per ID must stay constant (quadratic code hashes each ID once per other ID).
    # The benchmark times 20k + 20k; here the work is counted, on a smaller input.
    view = select(PoolConfig(mode=mode), inv(*gpu_hcas()))
    n = 2_000
    available = [_CountedId(f"hca-{i:05d}") for i in range(2 * n)]
    must = available[::2]
    _CountedId.hashes = 0
    got = view.preferred(available, must, n + 5)
    assert got[:n] == must
    assert len(got) == n + 5
    assert _CountedId.hashes < 20 * 2 * n


def test_allocation_is_a_plain_record_with_topology() -> None:
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*gpu_hcas()), env=HCA_ONLY)
    ids = exclusive_ids(view.hcas)
    a = view.allocate([ids["mlx5_1"], ids["mlx5_5"]])
    assert a.hcas == ("mlx5_1", "mlx5_5")
    assert dict(a.envs) == {"RDMA_HCA_DEVICES": "mlx5_1,mlx5_5",
                            "NCCL_IB_HCA": "=mlx5_1:1,mlx5_5:1"}
    assert a.numa_nodes == (0, 1)
    assert a.mounts == () and a.cdi_devices == ()
    assert hash(a) == hash(view.allocate([ids["mlx5_1"], ids["mlx5_5"]]))
    cdi = select(PoolConfig(), inv(*gpu_hcas()[:2]), cdi=True).allocate(["hca-0000"])
    assert cdi.cdi_devices == ("rdma-hca.io/hca=mlx5_0", "rdma-hca.io/hca=mlx5_1")
    assert cdi.devices == ()


def test_unknown_ids_show_a_short_prefix_only() -> None:
    view = select(PoolConfig(rdma_hca_max=10), inv(*gpu_hcas()))
    huge = ["x" * 100_000] + [f"bogus-{i}" for i in range(10_000)]
    with pytest.raises(UnknownDeviceIds) as err:
        view.allocate(huge)
    text = str(err.value)
    assert len(text) < 600
    assert "(100000 characters)" in text and text.endswith("bogus-3 and 9996 more")


@pytest.mark.parametrize("when", [UnhealthyWhen.ANY, UnhealthyWhen.ALL])
def test_a_missing_hca_counts_as_down(when: UnhealthyWhen) -> None:
    hcas = gpu_hcas()
    view = select(PoolConfig(unhealthy_when=when), inv(*hcas[1:]), missing=hcas[:1])
    assert len(view.devices()) == 1000
    assert all(d.healthy for d in view.devices()) is (when is UnhealthyWhen.ALL)
    assert any("mlx5_0: disappeared" in p for p in view.problems())
    # All gone: still advertised (Unhealthy), not an empty pool.
    gone = select(PoolConfig(), inv(), missing=hcas)
    assert len(gone.devices()) == 1000 and not any(d.healthy for d in gone.devices())


def test_a_missing_hca_keeps_its_exclusive_id_unhealthy() -> None:
    hcas = gpu_hcas()
    view = select(PoolConfig(mode=Mode.EXCLUSIVE), inv(*hcas[1:]), missing=hcas[:1])
    devices = {d.id: d for d in view.devices()}
    assert len(devices) == 8
    assert not devices["0000:1a:00.0"].healthy
    assert sum(d.healthy for d in devices.values()) == 7
    assert view.allocate(["0000:1a:00.0"]).hcas == ()
