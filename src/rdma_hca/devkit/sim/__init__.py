"""Simulated machines for tests, the demo and benchmarks.

Nothing here is imported by the daemon's serving path: these modules only write
trees shaped like a real node's ``/sys`` and ``/dev`` so the real code can read them.
"""

from rdma_hca.devkit.sim.nodes import (
    GpuSpec,
    HcaSpec,
    PortSpec,
    SimNode,
    broken_nodes,
    build_node,
    erdma_node,
    gpu_node,
    hostile_nodes,
    infiniband_node,
    mlx4_infiniband_node,
    mlx5_roce_bond_node,
    no_rdma_node,
    soft_roce_node,
)

__all__ = [
    "GpuSpec",
    "HcaSpec",
    "PortSpec",
    "SimNode",
    "broken_nodes",
    "build_node",
    "erdma_node",
    "gpu_node",
    "hostile_nodes",
    "infiniband_node",
    "mlx4_infiniband_node",
    "mlx5_roce_bond_node",
    "no_rdma_node",
    "soft_roce_node",
]
