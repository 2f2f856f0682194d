"""The DRA driver: the node's HCAs as ResourceSlices, prepared into CDI devices.

``DraDriver`` is the whole public surface: build it from a :class:`DriverConfig` (the
driver's view of the daemon's settings), feed it inventories with ``update``, and
``start``/``stop`` it beside (or instead of) the device plugin pools.
"""

from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.driver import DraDriver

__all__ = ["DraDriver", "DriverConfig"]
