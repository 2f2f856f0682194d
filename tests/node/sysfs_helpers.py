"""Readers only tests use, kept out of the node wing (it ships in the node image)."""

from __future__ import annotations

import os

from rdma_hca.node.inventory import Discovery, discover_node
from rdma_hca.node.model import Hca
from rdma_hca.node.sysfs_walk import StrPath


def discover(sysfs_root: StrPath, dev_root: StrPath) -> list[Hca]:
    """The HCAs of ``discover_node`` as a list."""
    return list(discover_node(sysfs_root, dev_root).hcas)


def read_netns_mode(sysfs_root: StrPath) -> str | None:
    """ib_core's netns mode alone, as discovery reads it ("shared", "exclusive", None)."""
    return Discovery(sysfs_root, os.devnull).netns_mode()
