"""Simulated machines for tests, the demo and benchmarks.

Nothing here is imported by the daemon's serving path: these modules only write
trees shaped like a real node's ``/sys`` and ``/dev`` so the real code can read them.
The catalogue is ``nodes``; its names are the package's.
"""

from rdma_hca.devkit.sim import nodes
from rdma_hca.devkit.sim.nodes import *  # noqa: F403

__all__ = nodes.__all__
