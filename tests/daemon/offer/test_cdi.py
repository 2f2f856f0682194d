"""CDI: the spec written from discovery, kept in sync, and Allocate naming CDI devices."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rdma_hca.daemon.offer.cdi import CDI_VERSION, SPEC_FILE, write_spec
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node, infiniband_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.settings.model import CdiConfig, Mode, PoolConfig, Settings

R = "rdma/hca"


def settings_for(node: SimNode, tmp_path: Path, **kw: object) -> Settings:
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir(exist_ok=True)
    base = Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                    kubelet_dir=str(plugin_dir), metrics_address="", health_poll_seconds=0.05,
                    cdi=CdiConfig(True, str(tmp_path / "cdi")))
    return replace(base, **kw)  # type: ignore[arg-type]


async def started_spec(settings: Settings, tmp_path: Path) -> dict[str, object]:
    """The spec a daemon has written by the time its start returns."""
    d = Daemon(settings, netlink=False)
    await d.start()
    try:
        return read_spec(tmp_path)
    finally:
        await d.stop()


def read_spec(tmp_path: Path) -> dict[str, object]:
    spec: dict[str, object] = json.loads((tmp_path / "cdi" / SPEC_FILE).read_text())
    return spec


async def test_spec_describes_each_hca_and_all(tmp_path: Path) -> None:
    node = gpu_node(tmp_path / "node", gid_table_size=8)
    spec = await started_spec(settings_for(node, tmp_path), tmp_path)
    assert spec["cdiVersion"] == CDI_VERSION
    assert spec["kind"] == "rdma-hca.io/hca"
    devices = {x["name"]: x for x in spec["devices"]}  # type: ignore[attr-defined]
    assert set(devices) == set(node.hca_names) | {"all"}
    mlx5_3 = devices["mlx5_3"]["containerEdits"]["deviceNodes"]
    assert mlx5_3 == [{"path": f"/dev/infiniband/{node.uverbs_name('mlx5_3')}",
                       "hostPath": f"/dev/infiniband/{node.uverbs_name('mlx5_3')}",
                       "permissions": "rw"}]
    assert len(devices["all"]["containerEdits"]["deviceNodes"]) == len(node.hca_names)
    assert spec["containerEdits"] == {"deviceNodes": [
        {"path": "/dev/infiniband/rdma_cm", "hostPath": "/dev/infiniband/rdma_cm",
         "permissions": "rw"}]}


async def test_infiniband_hca_includes_umad(tmp_path: Path) -> None:
    node = infiniband_node(tmp_path / "node")
    spec = await started_spec(settings_for(node, tmp_path), tmp_path)
    (dev,) = [x for x in spec["devices"]  # type: ignore[attr-defined]
              if x["name"] != "all"]
    paths = [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
    assert sum(p.startswith("/dev/infiniband/umad") for p in paths) == 2


async def test_spec_follows_hca_loss_and_allocate_names_cdi_devices(tmp_path: Path) -> None:
    node = gpu_node(tmp_path / "node", gid_table_size=8)
    settings = settings_for(node, tmp_path, pools=(PoolConfig(mode=Mode.EXCLUSIVE),))
    kubelet = KubeletEmulator(settings.kubelet_dir)
    await kubelet.start()
    d = Daemon(settings, netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == len(node.hca_names))
        resp = await kubelet.allocate(R, [[node.specs["mlx5_1"].pci_address or ""]])
        c = resp.container_responses[0]
        assert [x.name for x in c.cdi_devices] == ["rdma-hca.io/hca=mlx5_1"]
        assert len(c.devices) == 0
        assert c.envs["RDMA_HCA_DEVICES"] == "mlx5_1"
        node.remove_hca("mlx5_1")
        assert await wait_until(
            lambda: "mlx5_1" not in {x["name"] for x in read_spec(tmp_path)["devices"]},  # type: ignore[attr-defined]
            5)
        assert list((tmp_path / "cdi").iterdir()) == [tmp_path / "cdi" / SPEC_FILE]
    finally:
        await d.stop()
        await kubelet.stop()


def test_write_is_skipped_when_unchanged(tmp_path: Path) -> None:
    spec = {"cdiVersion": CDI_VERSION, "kind": "rdma-hca.io/hca", "devices": []}
    assert write_spec(str(tmp_path), spec) is True
    assert write_spec(str(tmp_path), spec) is False
    spec["devices"] = [{"name": "x", "containerEdits": {}}]
    assert write_spec(str(tmp_path), spec) is True
    assert json.loads((tmp_path / SPEC_FILE).read_text())["devices"][0]["name"] == "x"
