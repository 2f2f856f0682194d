"""Each HCA device carries its switch and switch port from LLDP; the slice is written when
a neighbour changes what it says, never for a refresh."""

from __future__ import annotations

from rdma_hca.contract.dra import HCA_ONLY_ATTRIBUTES
from rdma_hca.contract.fabric import SWITCH, SWITCH_PORT, PortNeighbour
from rdma_hca.daemon.dra.devices import MAX_STRING_VALUE, DeviceOffer
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.node.model import CharDevice, Hca, LinkLayer, Port
from rdma_hca.settings.model import Mode

DRIVER = "rdma-hca.io"


def _hca(name: str) -> Hca:
    port = Port(number=1, state="ACTIVE", phys_state="LinkUp", link_layer=LinkLayer.ETHERNET,
                rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, netdevs=("eth0",), gids=())
    return Hca(name=name, driver="mlx5_core", node_guid=None, fw_ver=None, board_id=None,
               hca_type=None, pci_address=None, pci_vendor=None, pci_device=None,
               numa_node=None, ports=(port,),
               uverbs=CharDevice("uverbs0", "/dev/infiniband/uverbs0", True))


def neighbour(hca: str, name: str = "leaf-1", port_id: str = "Ethernet1",
              chassis: str = "0c:42:a1:00:00:01", netdev: str = "eth0") -> PortNeighbour:
    return PortNeighbour(hca, 1, netdev, chassis, port_id, name, "")


def test_the_attributes_name_the_switch_else_its_chassis() -> None:
    offer = DeviceOffer.build(
        [_hca("mlx5_0"), _hca("mlx5_1"), _hca("mlx5_2")], DRIVER, Mode.SHARED, True, None,
        neighbours={"mlx5_0": neighbour("mlx5_0"),
                    "mlx5_1": neighbour("mlx5_1", name="", chassis="0c:42:a1:00:00:09")})
    attrs = {d["name"]: d["attributes"] for d in offer.devices}
    assert attrs["mlx5-0"][f"{DRIVER}/{SWITCH}"] == {"string": "leaf-1"}
    assert attrs["mlx5-0"][f"{DRIVER}/{SWITCH_PORT}"] == {"string": "Ethernet1"}
    assert attrs["mlx5-1"][f"{DRIVER}/{SWITCH}"] == {"string": "0c:42:a1:00:00:09"}
    # No neighbour heard: no attribute (a selector naming it is false there).
    assert f"{DRIVER}/{SWITCH}" not in attrs["mlx5-2"]
    assert f"{DRIVER}/{SWITCH}" not in attrs["all-hcas"]
    assert {SWITCH, SWITCH_PORT} <= HCA_ONLY_ATTRIBUTES


def test_a_long_name_is_cut_to_what_the_api_server_takes() -> None:
    offer = DeviceOffer.build([_hca("mlx5_0")], DRIVER, Mode.SHARED, True, None,
                              neighbours={"mlx5_0": neighbour("mlx5_0", name="x" * 200)})
    value = offer.devices[0]["attributes"][f"{DRIVER}/{SWITCH}"]
    assert value == {"string": "x" * MAX_STRING_VALUE}


async def test_one_slice_write_per_change_none_per_refresh(stage: DraStage,
                                                           api: FakeApiServer) -> None:
    driver = stage.driver
    assert driver is not None
    assert await stage.until(lambda: driver.stats().published)
    before = len(api.writes())
    heard = (neighbour("mlx5_0"), neighbour("mlx5_1", port_id="Ethernet2"))
    await driver.update_neighbours(heard)
    assert await stage.until(lambda: stage.devices()["mlx5-0"]["attributes"].get(
        f"{DRIVER}/{SWITCH}") == {"string": "leaf-1"})
    assert stage.devices()["mlx5-1"]["attributes"][f"{DRIVER}/{SWITCH_PORT}"] == {
        "string": "Ethernet2"}
    after_change = len(api.writes())
    assert after_change == before + 1
    # The same neighbours again (a frame every 30 s): the slice says the same, no write.
    await driver.update_neighbours(tuple(heard))
    await driver.update_neighbours(tuple(heard))
    # A switch replaced on mlx5_0: one write more.
    await driver.update_neighbours((neighbour("mlx5_0", name="leaf-9"), heard[1]))
    assert await stage.until(lambda: stage.devices()["mlx5-0"]["attributes"].get(
        f"{DRIVER}/{SWITCH}") == {"string": "leaf-9"})
    assert len(api.writes()) == after_change + 1
