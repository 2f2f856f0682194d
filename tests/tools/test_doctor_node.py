"""``rdma-hca doctor --node`` on simulated nodes, real unix sockets and a real readyz server."""

from __future__ import annotations

import io
import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.devkit.sim.hostile import hostile_nodes
from rdma_hca.devkit.sim.nodes import gpu_node, infiniband_node, no_rdma_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.tools.doctor import add_parser, main
from rdma_hca.tools.doctor import node as doctor_node
from rdma_hca.tools.doctor.result import parse_command


class _Readyz(ThreadingHTTPServer):
    daemon_threads = True
    status = 200
    body = b"ok: registered rdma/hca\n"


class _ReadyzHandler(BaseHTTPRequestHandler):
    server: _Readyz

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)


@pytest.fixture
def readyz() -> Iterator[_Readyz]:
    server = _Readyz(("127.0.0.1", 0), _ReadyzHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@dataclass
class Host:
    """A node as the doctor sees it: sim trees, a device-plugins dir with real sockets."""

    node: SimNode
    kubelet_dir: Path
    readyz_url: str
    sockets: list[socket.socket] = field(default_factory=list)

    def listen(self, name: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(self.kubelet_dir / name))
        s.listen()
        self.sockets.append(s)

    def doctor(self, *extra: str, env: dict[str, str] | None = None) -> int:
        argv = ["--node", "--sysfs-root", str(self.node.sysfs_root), "--dev-root",
                str(self.node.dev_root), "--kubelet-dir", str(self.kubelet_dir),
                "--readyz-url", self.readyz_url, *extra]
        return main(argv, env=env or {})

    def doctor_with_deadline(self, deadline: float, *extra: str) -> tuple[int, str]:
        """The doctor with a short read deadline (a flag of the CLI, not of ``main``)."""
        argv = ["--node", "--sysfs-root", str(self.node.sysfs_root), "--dev-root",
                str(self.node.dev_root), "--kubelet-dir", str(self.kubelet_dir),
                "--readyz-url", self.readyz_url, *extra]
        args = parse_command("doctor", add_parser, argv)
        assert not isinstance(args, int)
        args.read_deadline_seconds = deadline
        out = io.StringIO()
        status = doctor_node.run(args, out=out, env={})
        return status, out.getvalue()


@pytest.fixture
def host(tmp_path: Path, readyz: _Readyz) -> Iterator[Host]:
    """A healthy GPU node: kubelet and plugin sockets listening, the plugin registered."""
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="dp") as short:
        h = Host(gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=8), Path(short),
                 f"http://127.0.0.1:{readyz.server_address[1]}/readyz")
        h.listen("kubelet.sock")
        h.listen("rdma-hca-rdma-hca.sock")
        yield h
        for s in h.sockets:
            s.close()


def test_healthy_node_passes(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    assert host.doctor() == 0
    out = capsys.readouterr().out
    assert "✗" not in out
    lines = out.splitlines()
    assert lines[0].split() == ["HCA", "PORT", "LINK", "STATE", "LAYER", "RATE", "NETDEV",
                                "DEVICE", "NODES", "NUMA", "PCIE", "ROOT"]
    assert lines[1].split()[:7] == ["mlx5_0", "1", "up", "ACTIVE/LinkUp", "Ethernet", "400G",
                                    "eth0"]
    assert lines[1].split()[-1] == host.node.expected_pcie_root("mlx5_0")
    assert "✓ HCAs: 2 found: mlx5_0, mlx5_1" in out
    assert "✓ rdma_cm: /dev/infiniband/rdma_cm" in out
    assert "✓ kubelet socket:" in out
    assert "rdma-hca-rdma-hca.sock" in out
    assert "answered 200: ok: registered rdma/hca" in out
    assert "✓ IPv6 for non-hostNetwork pods: not needed" in out


def test_port_down(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    host.node.set_port("mlx5_1", 1, up=False)
    assert host.doctor() == 1
    out = capsys.readouterr().out
    assert "✗ HCA mlx5_1: no port up (port 1 DOWN/Disabled eth1)" in out
    assert "ip link set eth1 up" in out
    assert ["mlx5_1", "1", "down"] in [line.split()[:3] for line in out.splitlines()]


def test_missing_device_node(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    name = host.node.uverbs_name("mlx5_0")
    host.node.remove_dev_node(name)
    assert host.doctor() == 1
    out = capsys.readouterr().out
    assert f"✗ HCA mlx5_0 device nodes: missing under {host.node.dev_root}: " \
           f"/dev/infiniband/{name}" in out
    assert f"{name}(missing)" in out


def test_missing_rdma_cm(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    host.node.remove_dev_node("rdma_cm")
    assert host.doctor() == 1
    assert "modprobe rdma_ucm" in capsys.readouterr().out


def test_no_hcas(host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host.node = no_rdma_node(tmp_path / "plain")
    assert host.doctor() == 1
    out = capsys.readouterr().out
    assert "✗ HCAs: none under" in out
    assert "modprobe mlx5_ib" in out


def test_infiniband_node_is_exempt_from_ipv6(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host.node = infiniband_node(tmp_path / "ib")
    assert host.doctor("--non-host-network") == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "✓ IPv6 for non-hostNetwork pods: every RoCE HCA has" in out
    assert "umad" in out  # IB ports need their umad nodes too


def test_non_host_network_on_an_ipv4_network_fails(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    assert host.doctor("--non-host-network") == 1
    out = capsys.readouterr().out
    assert ("✗ IPv6 for non-hostNetwork pods: nonHostNetwork is on but these RoCE HCAs have "
            "no RoCE v2 GID with a global IPv6 address: mlx5_0, mlx5_1") in out
    assert "needs an IPv6 compute network" in out


def test_non_host_network_on_ipv6_passes(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host.node = gpu_node(tmp_path / "v6", hcas=2, bond=False, ipv6=True, gid_table_size=8)
    assert host.doctor("--non-host-network") == 0
    assert "✓ IPv6 for non-hostNetwork pods: every RoCE HCA" in capsys.readouterr().out


def test_non_host_network_read_from_config_file(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("resourceName: rdma/hca\nnonHostNetwork: true\n")
    assert host.doctor("--config", str(config)) == 1
    assert "nonHostNetwork is on" in capsys.readouterr().out
    config.write_text("nonHostNetwork: false\n")
    assert host.doctor("--config", str(config)) == 0


def test_non_host_network_read_from_the_plugins_environment(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    assert host.doctor(env={"RDMA_HCA_NON_HOST_NETWORK": "true"}) == 1
    assert "nonHostNetwork is on" in capsys.readouterr().out


def test_bad_config_file_is_a_usage_error(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("nonHostNetwork: perhaps\n")
    assert host.doctor("--config", str(config)) == 2
    err = capsys.readouterr().err
    assert "nonHostNetwork" in err
    assert "perhaps" in err


def test_exclusive_netns_with_non_host_network(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host.node = gpu_node(tmp_path / "v6", hcas=2, bond=False, ipv6=True, gid_table_size=8)
    host.node.set_netns_mode("exclusive")
    assert host.doctor("--non-host-network") == 1
    out = capsys.readouterr().out
    assert "✗ RDMA netns mode: exclusive: HCAs are visible only in the host's" in out
    assert "rdma system set netns shared" in out


def test_exclusive_netns_is_fine_for_host_network_pods(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    host.node.set_netns_mode("exclusive")
    assert host.doctor() == 0
    assert "✓ RDMA netns mode: exclusive (fine while only hostNetwork pods" in (
        capsys.readouterr().out)


def test_no_kubelet_socket(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    (host.kubelet_dir / "kubelet.sock").unlink()
    (host.kubelet_dir / "kubelet.sock").write_text("")  # a plain file is not a socket
    assert host.doctor() == 1
    out = capsys.readouterr().out
    assert "kubelet.sock is not a socket" in out
    assert "--kubelet-dir" in out


def test_no_plugin_socket(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    (host.kubelet_dir / "rdma-hca-rdma-hca.sock").unlink()
    assert host.doctor() == 1
    out = capsys.readouterr().out
    assert "✗ plugin socket: no rdma-hca-*.sock socket in" in out
    assert "kubectl -n kube-system logs ds/ack-rdma-dp-ds" in out


def test_not_registered(host: Host, readyz: _Readyz, capsys: pytest.CaptureFixture[str]) -> None:
    readyz.status, readyz.body = 503, b"not registered: kubelet.sock missing\n"
    assert host.doctor() == 1
    out = capsys.readouterr().out
    assert "answered 503: not registered: kubelet.sock missing" in out
    assert "has not registered with the kubelet" in out


def test_readyz_unreachable(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host.readyz_url = f"http://127.0.0.1:{port}/readyz"
    assert host.doctor() == 1
    assert f"cannot reach http://127.0.0.1:{port}/readyz" in capsys.readouterr().out


def test_json(host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    host.node.set_port("mlx5_0", 1, up=False)
    assert host.doctor("--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["netnsMode"] == "shared"
    hcas = {h["name"]: h for h in doc["hcas"]}
    assert hcas["mlx5_0"]["ports"][0]["up"] is False
    assert hcas["mlx5_1"]["ports"][0]["up"] is True
    assert hcas["mlx5_1"]["pcieRoot"] == host.node.expected_pcie_root("mlx5_1")
    assert hcas["mlx5_1"]["pciBusID"] == host.node.specs["mlx5_1"].pci_address
    assert doc["stalled"] == []
    failed = [c["name"] for c in doc["checks"] if not c["ok"]]
    assert failed == ["HCA mlx5_0"]


def test_a_file_that_never_answers_is_named_and_the_doctor_ends(host: Host) -> None:
    rel = "class/infiniband/mlx5_1/ports/1/phys_state"
    host.node.replace_with_fifo(rel)
    path = os.path.abspath(host.node.sysfs_root / rel)
    try:
        status, out = host.doctor_with_deadline(1.0)
        assert status == 1
        assert f"✗ sysfs reads: 1 file(s) did not answer within 1 s: {path}" in out
        assert "✗ HCA mlx5_1: no port up (port 1 UNKNOWN/UNKNOWN eth1)" in out
        status, raw = host.doctor_with_deadline(1.0, "--json")
        doc = json.loads(raw)
        assert doc["stalled"] == [path]
        assert [c["name"] for c in doc["checks"] if not c["ok"]][:2] == [
            "sysfs reads", "HCA mlx5_1"]
    finally:
        host.node.release_fifos()


def test_non_utf8_names_do_not_crash_the_doctor(host: Host, tmp_path: Path) -> None:
    host.node = hostile_nodes(tmp_path / "hostile")["non_utf8_names"]
    status, out = host.doctor_with_deadline(5.0)
    out.encode("utf-8")
    assert status == 1  # the oddly named HCA cannot be offered
    assert "HCA mlx5_\\xff: its name holds bytes that are not UTF-8" in out
    status, raw = host.doctor_with_deadline(5.0, "--json")
    doc = json.loads(raw.encode("utf-8"))
    assert [h["name"] for h in doc["hcas"]] == ["mlx5_1", "mlx5_\\xff"]
    assert doc["hcas"][0]["ports"][0]["netdevs"] == ["eth\\xfe1"]


def _checkpoint(plugins: Path, claims: dict[str, Any], driver: str = "rdma-hca.io") -> Path:
    from rdma_hca.contract.checkpoint import encode

    path = plugins / driver / "checkpoint.json"
    path.parent.mkdir(parents=True)
    path.write_text(encode(claims))
    return path


def _claim(ns: str, name: str, hca: str, *bandwidths: int) -> Any:
    from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice, Share

    device = hca.replace("_", "-")
    return PreparedClaim(ns, name, (PreparedDevice(
        ("hca",), "node-a", device, hca, (f"rdma-hca.io/claim=u-{device}",),
        tuple(Share(f"share-{name}-{i}", b) for i, b in enumerate(bandwidths))),))


def test_who_holds_how_much_of_each_hca(host: Host, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "plugins"
    _checkpoint(plugins, {"u1": _claim("train", "a", "mlx5_0", 100 * 10**9),
                          "u2": _claim("train", "b", "mlx5_0", 30 * 10**9, 20 * 10**9),
                          "u3": _claim("web", "plain", "mlx5_1")})
    assert host.doctor("--plugins-dir", str(plugins)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.split()[:3] == ["HCA", "BANDWIDTH", "HELD"]), None)
    assert start is not None, out
    assert lines[start].split() == ["HCA", "BANDWIDTH", "HELD", "OF", "CLAIMS", "HELD", "BY"]
    rows = {line.split()[0]: line.split() for line in lines[start + 1:start + 3]}
    assert rows["mlx5_0"][:4] == ["mlx5_0", "150G", "400G", "2"]
    assert "train/a 100G, train/b 50G" in out
    assert rows["mlx5_1"][:4] == ["mlx5_1", "0G", "400G", "1"]
    assert "✓ DRA bandwidth: 3 prepared claim(s); 1 HCA(s) with bandwidth held" in out
    assert host.doctor("--plugins-dir", str(plugins), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    mlx5_0 = doc["draShares"]["hcas"][0]
    assert (mlx5_0["name"], mlx5_0["heldBitsPerSecond"], mlx5_0["rateBitsPerSecond"]) == (
        "mlx5_0", 150 * 10**9, 400 * 10**9)
    assert mlx5_0["claims"][1]["shareIDs"] == ["share-b-0", "share-b-1"]


def test_no_checkpoint_says_nothing_and_a_bad_one_fails(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert host.doctor("--plugins-dir", str(tmp_path / "none")) == 0
    assert "DRA" not in capsys.readouterr().out
    path = _checkpoint(tmp_path / "p", {"u": _claim("ns", "c", "mlx5_0", 10**9)})
    path.write_text(path.read_text().replace("1000000000", "2000000000"))
    assert host.doctor("--plugins-dir", str(tmp_path / "p")) == 1
    out = capsys.readouterr().out
    assert "✗ DRA checkpoint:" in out and "does not match its checksum" in out
    assert "restart its pod" in out
    # More held than the port's rate (it slowed since the claims were placed).
    over = _checkpoint(tmp_path / "q", {"u": _claim("ns", "c", "mlx5_1", 500 * 10**9)})
    assert host.doctor("--plugins-dir", str(over.parents[1])) == 1
    assert "✗ DRA bandwidth: mlx5_1: 500G held of 400G" in capsys.readouterr().out


def test_inside_the_plugin_pod_the_checkpoint_is_found_from_its_settings(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "kubelet"
    _checkpoint(root / "plugins", {"u": _claim("ns", "c", "mlx5_1", 25 * 10**9)},
                driver="hca.example.com")
    env = {"RDMA_HCA_KUBELET_ROOT": str(root), "RDMA_HCA_DRA_DRIVER_NAME": "hca.example.com"}
    assert host.doctor("--json", env=env) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["draShares"]["checkpoint"] == str(
        root / "plugins" / "hca.example.com" / "checkpoint.json")
    assert doc["draShares"]["hcas"][1]["heldBitsPerSecond"] == 25 * 10**9


def _node_wide_claim(ns: str, name: str, hcas: str, shares: int = 1) -> Any:
    """A claim of the node-wide device as the driver records it: every HCA it gave."""
    from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice, Share

    return PreparedClaim(ns, name, (PreparedDevice(
        ("rdma-hca",), "node-a", "all-hcas", hcas, ("rdma-hca.io/claim=u-all-hcas",),
        tuple(Share(f"share-{name}-{i}") for i in range(shares))),))


def test_node_wide_claims_are_listed_apart_and_hold_no_hca(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "plugins"
    # One claim gave both HCAs, one was prepared when only mlx5_0 was usable: neither
    # holds an HCA, though "mlx5_0" is the name of one.
    _checkpoint(plugins, {"u1": _claim("train", "a", "mlx5_0", 100 * 10**9),
                          "u2": _node_wide_claim("web", "x", "mlx5_0,mlx5_1", shares=2),
                          "u3": _node_wide_claim("web", "y", "mlx5_0")})
    assert host.doctor("--plugins-dir", str(plugins)) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["mlx5_0"], ["mlx5_1"]) and "G" in line.split()[1]}
    assert rows["mlx5_0"][:4] == ["mlx5_0", "100G", "400G", "1"]
    assert rows["mlx5_1"][:4] == ["mlx5_1", "0G", "400G", "0"]
    assert ("✓ DRA bandwidth: 3 prepared claim(s); 1 HCA(s) with bandwidth held; the "
            "node-wide device (rdma/hca through DRA) held by 2 claim(s): web/x (hcaCount 2), "
            "web/y (hcaCount 1)") in out
    assert host.doctor("--plugins-dir", str(plugins), "--json") == 0
    doc = json.loads(capsys.readouterr().out)["draShares"]
    assert [len(h["claims"]) for h in doc["hcas"]] == [1, 0]
    assert doc["nodeDevice"] == {"name": "all-hcas", "claims": [
        {"namespace": "web", "name": "x", "uid": "u2", "hcaCount": 2,
         "hcas": ["mlx5_0", "mlx5_1"], "shareIDs": ["share-x-0", "share-x-1"],
         "adminAccess": False},
        {"namespace": "web", "name": "y", "uid": "u3", "hcaCount": 1, "hcas": ["mlx5_0"],
         "shareIDs": ["share-y-0"], "adminAccess": False}]}


def test_each_hca_shows_the_claims_on_it_that_hold_no_bandwidth(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "plugins"
    # The scheduler keeps the bandwidth held under the rate, counting only claims that
    # ask: a share of 0, no share at all and node-wide claims use the HCA uncounted.
    _checkpoint(plugins, {"u1": _claim("train", "a", "mlx5_0", 100 * 10**9),
                          "u2": _claim("web", "plain", "mlx5_0", 0),
                          "u3": _claim("web", "none", "mlx5_1"),
                          "u4": _node_wide_claim("web", "x", "mlx5_0,mlx5_1"),
                          "u5": _node_wide_claim("web", "y", "mlx5_0")})
    assert host.doctor("--plugins-dir", str(plugins)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.split()[:3] == [
        "HCA", "HOLDING", "BANDWIDTH"]), None)
    assert start is not None, out
    assert [c.strip() for c in lines[start].split("   ") if c.strip()] == [
        "HCA", "HOLDING BANDWIDTH", "HOLDING NONE", "NODE-WIDE", "NOT COUNTED AGAINST THE RATE"]
    rows = [[c.strip() for c in line.split("   ") if c.strip()]
            for line in lines[start + 1:start + 3]]
    assert rows == [
        ["mlx5_0", "1", "1", "2", "web/plain, web/x (node-wide), web/y (node-wide)"],
        ["mlx5_1", "0", "1", "1", "web/none, web/x (node-wide)"]]
    assert ("✓ DRA bandwidth: 5 prepared claim(s); 1 HCA(s) with bandwidth held; the "
            "node-wide device (rdma/hca through DRA) held by 2 claim(s): web/x (hcaCount 2), "
            "web/y (hcaCount 1); not counted against the rate: 2 claim(s) holding no "
            "bandwidth and 2 node-wide claim(s), on mlx5_0 (3), mlx5_1 (2) (the scheduler "
            "counts only claims that ask for bandwidth)") in out
    assert host.doctor("--plugins-dir", str(plugins), "--json") == 0
    hcas = json.loads(capsys.readouterr().out)["draShares"]["hcas"]
    assert hcas[0]["heldBitsPerSecond"] == 100 * 10**9
    assert hcas[0]["claimsHoldingNone"] == [{"namespace": "web", "name": "plain", "uid": "u2"}]
    assert hcas[0]["nodeWideClaims"] == [{"namespace": "web", "name": "x", "uid": "u4"},
                                         {"namespace": "web", "name": "y", "uid": "u5"}]
    assert hcas[1]["claimsHoldingNone"] == [{"namespace": "web", "name": "none", "uid": "u3"}]
    assert hcas[1]["nodeWideClaims"] == [{"namespace": "web", "name": "x", "uid": "u4"}]


def _admin(claim: Any) -> Any:
    """The same claim, its devices given with admin access."""
    import dataclasses

    return dataclasses.replace(claim, devices=tuple(
        dataclasses.replace(d, admin_access=True) for d in claim.devices))


def test_a_claim_with_admin_access_is_marked_and_not_taken_for_one_holding_none(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "plugins"
    # A fabric monitor's claims see the HCAs and hold nothing of them, by design: they are
    # no gap in the scheduler's sum of bandwidth.
    _checkpoint(plugins, {"u1": _claim("train", "a", "mlx5_0", 100 * 10**9),
                          "u2": _admin(_claim("monitor", "probe", "mlx5_0")),
                          "u3": _admin(_node_wide_claim("monitor", "all", "mlx5_0,mlx5_1"))})
    assert host.doctor("--plugins-dir", str(plugins)) == 0
    out = capsys.readouterr().out
    assert "monitor/probe (admin access), train/a 100G" in out
    assert ("✓ DRA bandwidth: 3 prepared claim(s); 1 HCA(s) with bandwidth held; the "
            "node-wide device (rdma/hca through DRA) held by 1 claim(s): monitor/all "
            "(admin access); with admin access, holding nothing: monitor/all, "
            "monitor/probe\n") in out
    assert "HOLDING NONE" not in out and "not counted" not in out
    assert host.doctor("--plugins-dir", str(plugins), "--json") == 0
    doc = json.loads(capsys.readouterr().out)["draShares"]
    assert [(c["name"], c["adminAccess"]) for c in doc["hcas"][0]["claims"]] == [
        ("probe", True), ("a", False)]
    assert doc["hcas"][0]["claimsHoldingNone"] == []
    assert doc["nodeDevice"]["claims"][0]["adminAccess"] is True


def test_when_every_claim_holds_bandwidth_nothing_is_uncounted(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "plugins"
    _checkpoint(plugins, {"u1": _claim("train", "a", "mlx5_0", 100 * 10**9),
                          "u2": _claim("train", "b", "mlx5_1", 10**9)})
    assert host.doctor("--plugins-dir", str(plugins)) == 0
    out = capsys.readouterr().out
    assert "HOLDING NONE" not in out and "not counted" not in out
    assert out.count("✓ DRA bandwidth: 2 prepared claim(s); 2 HCA(s) with bandwidth held\n") == 1
    assert host.doctor("--plugins-dir", str(plugins), "--json") == 0
    hcas = json.loads(capsys.readouterr().out)["draShares"]["hcas"]
    assert [(h["claimsHoldingNone"], h["nodeWideClaims"]) for h in hcas] == [([], []), ([], [])]
