"""``rdma-hca check`` on simulated nodes and hand-written /proc files, one case per verdict."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from rdma_hca.devkit.sim.nodes import gpu_node, no_rdma_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.tools.check import main

GOOD_LIMITS = """\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max file size             unlimited            unlimited            bytes
Max locked memory         unlimited            unlimited            bytes
Max address space         unlimited            unlimited            bytes
"""
DOCKER_LIMITS = GOOD_LIMITS.replace(
    "Max locked memory         unlimited            unlimited",
    "Max locked memory         8388608              8388608  ",
)
# CapEff of a container with Docker's default set plus IPC_LOCK (bit 14) ...
CAPS_WITH_IPC_LOCK = "00000000a80465fb"
# ... and the default set alone.
CAPS_DEFAULT = "00000000a80425fb"


def status_text(cap_eff: str) -> str:
    return (
        "Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nPid:\t1\n"
        f"CapInh:\t0000000000000000\nCapPrm:\t{cap_eff}\nCapEff:\t{cap_eff}\n"
        f"CapBnd:\t{cap_eff}\nCapAmb:\t0000000000000000\nNoNewPrivs:\t0\n"
    )


def mountinfo_text(shm_options: str | None) -> str:
    lines = [
        "1489 1380 0:155 / / rw,relatime master:512 - overlay overlay rw,lowerdir=/l,upperdir=/u",
        "1490 1489 0:158 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw",
        "1491 1489 0:159 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,inode64",
        "1494 1491 0:157 / /dev/mqueue rw,nosuid,nodev,noexec,relatime - mqueue mqueue rw",
        "1496 1489 0:153 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro",
    ]
    if shm_options is not None:
        lines.append(f"1495 1491 0:154 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm "
                     f"{shm_options}")
    return "\n".join(lines) + "\n"


@dataclass
class Container:
    """What a container sees: a sim node's sysfs and /dev, plus its own /proc files."""

    node: SimNode
    proc_root: Path
    env: dict[str, str]

    def write_proc(self, name: str, text: str) -> None:
        (self.proc_root / "self" / name).write_text(text)

    def run(self, *extra: str) -> int:
        argv = ["--proc-root", str(self.proc_root), "--sysfs-root", str(self.node.sysfs_root),
                "--dev-root", str(self.node.dev_root), *extra]
        return main(argv, env=self.env)


@pytest.fixture
def container(tmp_path: Path) -> Container:
    """A well set-up workload on a GPU node: every check passes."""
    node = gpu_node(tmp_path / "node", hcas=2, bond=False, gid_table_size=8)
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    c = Container(node, proc, {"RDMA_HCA_DEVICES": "mlx5_0,mlx5_1"})
    c.write_proc("limits", GOOD_LIMITS)
    c.write_proc("status", status_text(CAPS_WITH_IPC_LOCK))
    c.write_proc("mountinfo", mountinfo_text("rw,size=8388608k,inode64"))
    return c


def test_everything_in_place_passes(container: Container,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert container.run() == 0
    out = capsys.readouterr().out
    assert "✗" not in out
    assert "✓ /dev/infiniband/rdma_cm: present, opens read-write" in out
    assert out.count("✓ /dev/infiniband/uverbs") == 2
    assert "✓ HCA mlx5_0: port 1 ACTIVE/LinkUp" in out
    assert "✓ memlock limit: unlimited" in out
    assert "✓ CAP_IPC_LOCK" in out
    assert "✓ /dev/shm size: 8 GiB (mountinfo)" in out
    assert "all 8 checks passed" in out


def test_env_missing_means_the_resource_was_not_requested(
    container: Container, capsys: pytest.CaptureFixture[str]
) -> None:
    container.env.clear()
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ RDMA_HCA_DEVICES: not set: this container did not ask for rdma/hca" in out
    assert "how to fix: add resources.limits rdma/hca: 1" in out


def test_env_empty_means_no_usable_hca(container: Container,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    container.env["RDMA_HCA_DEVICES"] = ""
    assert container.run() == 1
    assert "the plugin had no usable HCA" in capsys.readouterr().out


def test_missing_uverbs_node(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    name = container.node.uverbs_name("mlx5_1")
    container.node.remove_dev_node(name)
    container.node.remove_dev_node(container.node.uverbs_name("mlx5_0"))
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ /dev/infiniband/uverbs*: none in this container" in out


def test_named_hca_without_its_device_node(
    container: Container, capsys: pytest.CaptureFixture[str]
) -> None:
    name = container.node.uverbs_name("mlx5_1")
    container.node.remove_dev_node(name)
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✓ HCA mlx5_0" in out
    assert (f"✗ HCA mlx5_1: port 1 ACTIVE/LinkUp, but its device node /dev/infiniband/{name} "
            "is not in this container") in out


def test_missing_rdma_cm(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.node.remove_dev_node("rdma_cm")
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ /dev/infiniband/rdma_cm: missing" in out
    assert "nonHostNetwork" in out


def test_device_node_that_cannot_be_opened_read_write(
    container: Container, capsys: pytest.CaptureFixture[str]
) -> None:
    # A directory cannot be opened O_RDWR even by root, so this fails wherever tests run.
    name = container.node.uverbs_name("mlx5_0")
    container.node.remove_dev_node(name)
    (container.node.dev_root / "infiniband" / name).mkdir()
    assert container.run() == 1
    out = capsys.readouterr().out
    assert f"✗ /dev/infiniband/{name}: cannot be opened read-write (Is a directory)" in out


def test_no_rdma_at_all(tmp_path: Path, container: Container,
                        capsys: pytest.CaptureFixture[str]) -> None:
    container.node = no_rdma_node(tmp_path / "plain")
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ /dev/infiniband/rdma_cm: missing" in out
    assert "✗ HCA mlx5_0: not visible in" in out


def test_hca_with_port_down(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.node.set_port("mlx5_1", 1, up=False)
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✓ HCA mlx5_0" in out
    assert "✗ HCA mlx5_1: no port up (port 1 DOWN/Disabled)" in out
    assert "check the cable" in out


def test_hca_named_but_not_visible(container: Container,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    # mlx5_1 is not mlx5_10: names are compared exactly.
    container.env["RDMA_HCA_DEVICES"] = "mlx5_0,mlx5_10"
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ HCA mlx5_10: not visible in" in out
    assert "hostNetwork: true" in out


def test_memlock_limited(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.write_proc("limits", DOCKER_LIMITS)
    container.write_proc("status", status_text(CAPS_DEFAULT))
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ memlock limit: 8 MiB (soft limit)" in out
    assert "how to fix: set memlock unlimited in the container runtime / add IPC_LOCK" in out


def test_memlock_limit_does_not_matter_with_ipc_lock(
    container: Container, capsys: pytest.CaptureFixture[str]
) -> None:
    container.write_proc("limits", DOCKER_LIMITS)
    assert container.run() == 0
    out = capsys.readouterr().out
    assert "✓ memlock limit: 8 MiB (soft limit); does not matter: CAP_IPC_LOCK" in out
    container.write_proc("limits", "garbage\n")
    assert container.run() == 0


def test_memlock_unreadable(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.write_proc("limits", "garbage\n")
    container.write_proc("status", status_text(CAPS_DEFAULT))
    assert container.run() == 1
    assert "no readable 'Max locked memory' line" in capsys.readouterr().out


def test_ipc_lock_missing(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.write_proc("status", status_text(CAPS_DEFAULT))
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ CAP_IPC_LOCK: not in the effective capabilities (CapEff 00000000a80425fb)" in out
    assert "add IPC_LOCK to securityContext.capabilities.add" in out


def test_ipc_lock_status_unreadable(container: Container,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    (container.proc_root / "self" / "status").unlink()
    assert container.run() == 1
    assert "no readable CapEff line" in capsys.readouterr().out


def test_docker_default_shm_fails(container: Container,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    container.write_proc("mountinfo", mountinfo_text("rw,size=65536k,inode64"))
    assert container.run() == 1
    out = capsys.readouterr().out
    assert "✗ /dev/shm size: 64 MiB (mountinfo): below 1 GiB" in out
    assert "mount an emptyDir with medium: Memory at /dev/shm" in out


def test_last_shm_mount_wins(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    # The emptyDir is mounted over the runtime's 64M tmpfs; the later line is what we see.
    text = mountinfo_text("rw,size=65536k") + (
        "1600 1491 0:200 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=2097152k\n")
    container.write_proc("mountinfo", text)
    assert container.run() == 0
    assert "✓ /dev/shm size: 2 GiB (mountinfo)" in capsys.readouterr().out


def test_shm_without_size_option_falls_back_to_statvfs(
    container: Container, capsys: pytest.CaptureFixture[str]
) -> None:
    container.write_proc("mountinfo", mountinfo_text(None))
    shm = container.node.dev_root / "shm"
    shm.mkdir()
    st = os.statvfs(shm)
    expect_ok = st.f_frsize * st.f_blocks >= 1 << 30
    assert container.run() == (0 if expect_ok else 1)
    assert f"{'✓' if expect_ok else '✗'} /dev/shm size: " in (out := capsys.readouterr().out)
    assert "(statvfs)" in out


def test_no_shm_at_all(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.write_proc("mountinfo", mountinfo_text(None))
    assert container.run() == 1
    assert "✗ /dev/shm size: no /dev/shm" in capsys.readouterr().out


def test_json(container: Container, capsys: pytest.CaptureFixture[str]) -> None:
    container.write_proc("status", status_text(CAPS_DEFAULT))
    assert container.run("--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == ["CAP_IPC_LOCK"]
    assert failed[0]["fix"] == "add IPC_LOCK to securityContext.capabilities.add"
    assert {c["subject"] for c in doc["checks"]} == {"container"}


def test_bad_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-such-flag"], env={}) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_a_file_that_never_answers_fails_its_hca_and_is_named(
    container: Container, capsys: pytest.CaptureFixture[str]
) -> None:
    rel = "class/infiniband/mlx5_1/ports/1/state"
    container.node.replace_with_fifo(rel)
    path = os.path.abspath(container.node.sysfs_root / rel)
    try:
        assert container.run("--read-deadline-seconds", "1") == 1
        out = capsys.readouterr().out
        assert "✗ HCA mlx5_1: no port up (port 1 UNKNOWN/UNKNOWN)" in out
        assert f"✗ sysfs reads: 1 file(s) did not answer within 1 s: {path}" in out
        assert "✓ HCA mlx5_0:" in out
    finally:
        container.node.release_fifos()


def test_bad_read_deadline_exits_2(container: Container,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert container.run("--read-deadline-seconds", "soon") == 2
    err = capsys.readouterr().err
    assert "readDeadlineSeconds" in err and "'soon'" in err, err
