"""LLDP on a real kernel: veth pairs in a network namespace of the test's own, real
AF_PACKET sockets, real frames (``lldp_netns.py`` runs the scenario). Where the machine
allows no network namespace (or has no ``ip``), the test says so and skips; the same
logic runs on recorded frames in ``test_lldp_listener``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIO = Path(__file__).with_name("lldp_netns.py")
UNSHARE = ["unshare", "--net", "--map-root-user"]


def _namespaces_allowed() -> str | None:
    """Why the kernel scenario cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "LLDP listening is Linux only (AF_PACKET)"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux, iproute2)"
    probe = subprocess.run([*UNSHARE, "ip", "link", "add", "p0", "type", "veth", "peer",
                            "name", "p1"], capture_output=True, text=True, timeout=30,
                           check=False)
    if probe.returncode != 0:
        return ("this machine allows no network namespace with a veth pair for the test "
                f"({probe.stderr.strip() or probe.returncode})")
    return None


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    why = _namespaces_allowed()
    if why is not None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("lldp-netns") / "node"
    result = subprocess.run([*UNSHARE, sys.executable, str(SCENARIO), str(root)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_real_frames_on_veth_make_neighbours(kernel_run: dict[str, Any]) -> None:
    r = kernel_run
    # The bonded HCA is heard on its members, not on the bond.
    assert r["listening"] == ["hca0", "m0", "m1"] and r["off"] is None
    assert r["heard"] and r["replaced"] and r["changes_for_replace"] == 1
    assert r["slice_switch"] == {"string": "leaf-2"}
    assert r["slice_switch_port"] == {"string": "Ethernet5"}
    assert r["bond_heard"] and r["bond_netdev"] == "m1"


@pytest.mark.slow
def test_real_garbage_and_floods_change_only_counters(kernel_run: dict[str, Any]) -> None:
    r = kernel_run
    assert r["unchanged_by_garbage"]
    assert r["dropped_bad"]["not-lldp"] == 1 and r["dropped_bad"]["missing-tlv"] == 2
    # Past the bucket, frames are read and counted, not parsed; the small receive buffer
    # leaves the rest to the kernel.
    assert 0 < r["flood_read"] <= r["flood_sent"]
    assert r["flood_rate_dropped"] > r["flood_read"] // 2
    assert r["flood_changes"] == 1


@pytest.mark.slow
def test_real_ttl_zero_and_expiry_forget_the_neighbour(kernel_run: dict[str, Any]) -> None:
    r = kernel_run
    assert r["ttl0_forgotten"] and r["ttl1_heard"] and r["ttl1_expired"]
    assert r["closed"]


def test_without_cap_net_raw_the_kernel_refuses_and_lldp_says_it_is_off(
        tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed (util-linux)")
    probe = subprocess.run(["unshare", "--user", "true"], capture_output=True, text=True,
                           timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"this machine allows no user namespace ({probe.stderr.strip()})")
    result = subprocess.run(["unshare", "--user", sys.executable, str(SCENARIO),
                             str(tmp_path / "node"), "no-capability"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["listening"] == []
    assert "CAP_NET_RAW" in out["off"] and "Operation not permitted" in out["off"]
    said = [line for line in result.stderr.splitlines() if "CAP_NET_RAW" in line]
    assert len(said) == 1  # for two inventories: said once
