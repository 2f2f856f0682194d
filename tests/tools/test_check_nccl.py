"""``rdma-hca check --nccl`` on simulated nodes: the env the plugin builds passes, and each
way NCCL would leave RDMA is one finding with its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdma_hca.daemon.offer.env import EnvSettings, build
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import NcclEnv
from rdma_hca.tools.check import main

LIMITS = ("Limit                     Soft Limit           Hard Limit           Units\n"
          "Max locked memory         unlimited            unlimited            bytes\n")
STATUS = "Name:\tpython3\nCapEff:\t00000000a80465fb\n"  # with IPC_LOCK
MOUNTINFO = ("1495 1491 0:154 / /dev/shm rw,nosuid,nodev - tmpfs shm rw,size=8388608k\n")


class Pod:
    def __init__(self, node: SimNode, tmp_path: Path) -> None:
        self.node = node
        self.proc = tmp_path / "proc"
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "self" / "limits").write_text(LIMITS)
        (self.proc / "self" / "status").write_text(STATUS)
        (self.proc / "self" / "mountinfo").write_text(MOUNTINFO)
        hcas = discover_node(node.sysfs_root, node.dev_root).hcas
        self.hcas = hcas
        self.env = {"RDMA_HCA_DEVICES": ",".join(h.name for h in hcas)}

    def leave_host_network(self) -> None:
        """The container's own network namespace: sysfs shows only its eth0 in class/net."""
        net = self.node.sysfs_root / "class" / "net"
        for entry in net.iterdir():
            entry.unlink()
        (net / "eth0").mkdir()

    def plugin_env(self, settings: EnvSettings) -> None:
        self.env = build(self.hcas, settings).as_dict()

    def run(self, *extra: str) -> int:
        return main(["--proc-root", str(self.proc), "--sysfs-root", str(self.node.sysfs_root),
                     "--dev-root", str(self.node.dev_root), "--nccl", *extra], env=self.env)


def roce_pod(tmp_path: Path, *hcas: sim.RoceHca) -> Pod:
    return Pod(sim.roce_node(tmp_path / "node", hcas), tmp_path)


AUTO = EnvSettings(nccl=NcclEnv.AUTO)


@pytest.mark.parametrize("settings", [AUTO, EnvSettings(NcclEnv.AUTO, non_host_network=True)],
                         ids=["host", "pod"])
def test_the_env_the_plugin_builds_passes(tmp_path: Path, settings: EnvSettings,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11", ipv6="2001:db8::11"),
                   sim.RoceHca("mlx5_1", ipv4="10.0.1.11", ipv6="2001:db8:1::11",
                               ipv6_first=True))
    pod.plugin_env(settings)
    assert pod.run() == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "✗" not in out
    assert "✓ NCCL_IB_HCA: =mlx5_0:1,mlx5_1:1: NCCL uses mlx5_0:1, mlx5_1:1" in out
    family = "AF_INET6" if settings.non_host_network else "AF_INET"
    assert f"✓ RoCE GID: {family}, RoCE v2:" in out


def test_the_default_family_on_an_ipv6_only_node_is_fatal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv6="2001:db8::11"))
    pod.env["NCCL_IB_HCA"] = "=mlx5_0:1"
    assert pod.run() == 1
    out = capsys.readouterr().out
    assert ("✗ RoCE GID: AF_INET (NCCL's default): no RoCE v2 GID of that family on "
            "mlx5_0:1") in out
    assert "how to fix: set NCCL_IB_ADDR_FAMILY=AF_INET6" in out


POD_NETWORK = EnvSettings(NcclEnv.AUTO, non_host_network=True)


def test_off_the_host_network_a_node_without_ipv6_is_said_in_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The plugin refused to guess (no family variable); check says why NCCL will fail.
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11", netdev="ens1f0np0"))
    pod.leave_host_network()
    pod.plugin_env(POD_NETWORK)
    assert "NCCL_IB_ADDR_FAMILY" not in pod.env and "NCCL_SOCKET_IFNAME" not in pod.env
    assert pod.run() == 1
    out = capsys.readouterr().out
    assert ("✗ RoCE GID: the GID family is AF_INET (NCCL's default), but this container is "
            "not on the host network") in out
    assert ("how to fix: the node has no RoCE v2 GID with a global IPv6 address on "
            "mlx5_0:1") in out
    pod.env["NCCL_IB_ADDR_FAMILY"] = "AF_INET6"  # what the guide asks for off the host
    assert pod.run() == 1
    out = capsys.readouterr().out
    assert "✗ RoCE GID: AF_INET6: no RoCE v2 GID of that family on mlx5_0:1" in out


def test_off_the_host_network_the_plugins_ipv6_choice_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11", ipv6="2001:db8::11",
                                         netdev="ens1f0np0"))
    pod.leave_host_network()
    pod.env["NCCL_IB_HCA"] = "=mlx5_0:1"
    assert pod.run() == 1  # NCCL's default, IPv4, is wrong here
    assert "how to fix: set NCCL_IB_ADDR_FAMILY=AF_INET6" in capsys.readouterr().out
    pod.plugin_env(POD_NETWORK)
    assert pod.env["NCCL_IB_GID_INDEX"] == "5"  # v1/v2 link-local, IPv4, then IPv6
    assert pod.run() == 0, capsys.readouterr().out
    assert "✓ RoCE GID: NCCL_IB_GID_INDEX=5 is a RoCE v2 GID on mlx5_0:1" in \
        capsys.readouterr().out


def test_a_gid_index_that_is_not_roce_v2_is_fatal(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    pod.env.update({"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "1"})
    assert pod.run() == 1
    out = capsys.readouterr().out
    assert ("NCCL_IB_GID_INDEX=1: mlx5_0:1 has RoCE v2 link-local GID at index 1 "
            "(a RoCE v2 GID is at index 3)") in out
    pod.env["NCCL_IB_GID_INDEX"] = "3"
    assert pod.run() == 0


def test_a_prefix_that_also_takes_mlx5_10_is_advisory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = sim.gpu_node(tmp_path / "gpu", hcas=11, bond=False, gid_table_size=8)
    pod = Pod(node, tmp_path)
    pod.env["NCCL_IB_HCA"] = "mlx5_1"
    assert pod.run() == 0
    out = capsys.readouterr().out
    assert "✗ NCCL_IB_HCA mlx5_1: without '=' NCCL matches prefixes: mlx5_1 also takes mlx5_10"\
        in out
    assert "how to fix: write NCCL_IB_HCA==mlx5_1" in out
    assert "advisory: NCCL still uses RDMA, exit 0" in out


def test_named_ports_down_or_absent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"),
                   sim.RoceHca("mlx5_1", ipv4="10.0.1.11", up=False))
    pod.env["RDMA_HCA_DEVICES"] = "mlx5_0"  # the base check fails an allocated HCA down
    pod.env["NCCL_IB_HCA"] = "=mlx5_0:1,mlx5_1:1,mlx5_7"
    assert pod.run() == 0  # mlx5_0 still carries NCCL over RDMA
    out = capsys.readouterr().out
    assert "✗ NCCL_IB_HCA mlx5_1:1: port down (port 1 DOWN/Disabled)" in out
    assert "✗ NCCL_IB_HCA mlx5_7: no such HCA in this container's sysfs" in out
    pod.env["NCCL_IB_HCA"] = "=mlx5_1:1"
    assert pod.run() == 1  # nothing left: NCCL would use sockets


@pytest.mark.parametrize(("var", "value"), [("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "Socket")])
def test_variables_that_force_sockets(tmp_path: Path, var: str, value: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    pod.plugin_env(AUTO)
    pod.env[var] = value
    assert pod.run() == 1
    assert f"✗ {var}: {value}: NCCL uses TCP sockets" in capsys.readouterr().out
    # Without --nccl the variables are not looked at.
    argv = ["--proc-root", str(pod.proc), "--sysfs-root", str(pod.node.sysfs_root),
            "--dev-root", str(pod.node.dev_root)]
    assert main(argv, env=pod.env) == 0


def test_a_socket_interface_that_is_not_here(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    pod.plugin_env(AUTO)
    assert pod.env["NCCL_SOCKET_IFNAME"] == "=eth0"
    pod.env["NCCL_SOCKET_IFNAME"] = "=eth9"
    assert pod.run() == 1
    assert "✗ NCCL_SOCKET_IFNAME: =eth9: no such interface here" in capsys.readouterr().out


def test_infiniband_needs_no_gid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = Pod(sim.infiniband_node(tmp_path / "ib"), tmp_path)
    pod.plugin_env(AUTO)
    assert pod.run("--json") == 0
    doc = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in doc["checks"]]
    assert "RoCE GID" not in names and doc["advisory"] == []
    (ucx,) = [c for c in doc["checks"] if c["name"] == "UCX_NET_DEVICES"]
    assert ucx["ok"] is True and ucx["detail"] == "mlx5_0:1,mlx5_0:2"


def test_no_hca_at_all_is_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = Pod(sim.no_rdma_node(tmp_path / "none"), tmp_path)
    assert pod.run() == 1
    assert "✗ NCCL IB devices: no HCA with a port up in this container: NCCL uses TCP " \
        "sockets" in capsys.readouterr().out


def test_a_family_nccl_does_not_read_is_fatal(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv6="2001:db8::11"))
    pod.env.update({"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_ADDR_FAMILY": "af_inet6"})
    assert pod.run() == 1
    assert "silently reads anything else as AF_INET" in capsys.readouterr().out
    pod.env["NCCL_IB_ADDR_FAMILY"] = "AF_INET6"
    assert pod.run() == 0


def test_an_empty_hca_list_is_no_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = roce_pod(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11"))
    pod.env["NCCL_IB_HCA"] = ""
    assert pod.run() == 0
    assert "✓ NCCL_IB_HCA: not set: NCCL uses every HCA this container can open (mlx5_0:1)" \
        in capsys.readouterr().out


def test_off_the_host_network_a_mixed_node_says_which_hca_was_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = Pod(sim.gpu_node(tmp_path / "node", ipv6=True, bond_ipv6=False, hcas=2,
                           gid_table_size=8), tmp_path)
    pod.leave_host_network()
    pod.plugin_env(POD_NETWORK)
    assert pod.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert pod.run() == 0  # NCCL uses the two others: said, not fatal
    out = capsys.readouterr().out
    assert ("NCCL_IB_HCA mlx5_bond_0:1: left out: mlx5_bond_0:1 has no RoCE v2 GID with a "
            "global IPv6 address, and the GID NCCL uses here is IPv6; NCCL uses the other "
            "HCAs") in out
    assert "give bond0 a global IPv6 address" in out
    assert "✓ RoCE GID: NCCL_IB_GID_INDEX=5 is a RoCE v2 GID on mlx5_0:1, mlx5_1:1" in out
    # On the host network the plugin lists every HCA with IPv4: nothing is left out.
    host = Pod(sim.gpu_node(tmp_path / "host", ipv6=True, bond_ipv6=False, hcas=2,
                            gid_table_size=8), tmp_path / "h")
    host.plugin_env(AUTO)
    assert host.run() == 0
    assert "left out" not in capsys.readouterr().out
