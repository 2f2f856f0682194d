"""`make demo` end to end: the device plugin walkthrough, then the same node through DRA."""

from __future__ import annotations

import pytest

from rdma_hca.devkit import commands


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
    assert "NodeUnprepareResources" in out
