"""`make demo` end to end: the device plugin walkthrough, then the same node through DRA."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

import pytest

from rdma_hca.devkit import commands
from rdma_hca.devkit.demo import run_walkthrough


@pytest.mark.slow
def test_the_demo_shows_both_paths(capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.demo(False) == 0
    out = capsys.readouterr().out
    # The device plugin: the node's resource, a port down taking allocatable to 0, a restart.
    assert "rdma/hca: 1k" in out
    assert "rdma/hca: 0" in out
    assert "The kubelet restarted" in out
    # DRA: a slice with each HCA's PCIe root, a prepared claim, a tainted device.
    assert "ResourceSlice" in out and "pci0000:" in out
    assert "NodePrepareResources" in out and "CDI" in out
    assert "linkState down" in out and "NoSchedule" in out
    # Two claims sharing one HCA by bandwidth, then released.
    assert "RDMA_HCA_BANDWIDTH=mlx5_0=150000000000" in out
    assert 'rdma_hca_dra_bandwidth_held{hca="mlx5_0"} 4e+11 of 4e+11' in out
    assert "held on mlx5_0: 0G" in out
    assert "NodeUnprepareResources" in out


def test_a_walkthrough_runs_in_a_temp_dir_and_gives_the_log_level_back(
        capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    seen: list[tuple[Path, bool, int]] = []

    async def walk(out: TextIO, workdir: Path) -> None:
        seen.append((workdir, workdir.is_dir(), root.level))
        print("step one", file=out)

    before = root.level
    assert run_walkthrough(walk, name="DRA demo") == 0
    ((workdir, existed, level),) = seen
    assert existed and workdir.name.startswith("rdma-hca-dra-demo-")
    assert not workdir.exists()
    assert level == logging.ERROR  # only errors while it runs, unless verbose
    assert root.level == before
    assert capsys.readouterr().out == "step one\n"


def test_a_step_that_times_out_is_one_line_and_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    async def walk(out: TextIO, workdir: Path) -> None:
        raise TimeoutError("the kubelet never saw the plugin")

    before = logging.getLogger().level
    assert run_walkthrough(walk, name="demo") == 1
    assert capsys.readouterr().err == "demo failed: the kubelet never saw the plugin\n"
    assert logging.getLogger().level == before
