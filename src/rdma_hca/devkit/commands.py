"""The devkit's subcommands (`simulate`, `demo`, `bench`), reached from the CLI by name."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rdma_hca.devkit.sim import nodes
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.exitcodes import EXIT_USAGE

BUILDERS: dict[str, Callable[[Path], SimNode]] = {
    "gpu": nodes.gpu_node,
    "gpu-ipv6": lambda r: nodes.gpu_node(r, ipv6=True),
    "infiniband": nodes.infiniband_node,
    "erdma": nodes.erdma_node,
    "soft-roce": nodes.soft_roce_node,
    "no-rdma": nodes.no_rdma_node,
}


def simulate(kind: str, directory: str) -> int:
    root = Path(directory)
    if root.exists() and any(root.iterdir()):
        print(f"rdma-hca simulate: {root} is not empty; give a new or empty directory",
              file=sys.stderr)
        return EXIT_USAGE
    node = BUILDERS[kind](root)
    print(f"--sysfs-root {node.sysfs_root} --dev-root {node.dev_root}")
    return 0


def demo(verbose: bool) -> int:
    """The device plugin walkthrough, then the same node served through DRA."""
    from rdma_hca.devkit.demo import run_demo
    from rdma_hca.devkit.dra.demo import run_dra_demo

    status = run_demo(verbose=verbose)
    if status:
        return status
    print()
    return run_dra_demo(verbose=verbose)


def bench(out_dir: str, quick: bool) -> int:
    from rdma_hca.devkit.bench import run_bench

    return run_bench(out_dir=out_dir, quick=quick)
