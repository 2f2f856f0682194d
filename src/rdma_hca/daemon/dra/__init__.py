"""The DRA driver: the node's HCAs as ResourceSlices, prepared into CDI devices.

``DraDriver`` is the whole public surface: build it from a :class:`DriverConfig` (the
driver's view of the daemon's settings), feed it inventories with ``update``,
``start``/``stop`` it beside (or instead of) the device plugin pools, and read its
``stats()``. Inside, the kubelet plugin helper (``kubeletplugin/``) and the driver
proper (``prepare``, ``recovery``, ``offering``) meet at one seam,
``kubeletplugin/plugin.py``.
"""

from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.driver import DraDriver

__all__ = ["DraDriver", "DriverConfig"]
