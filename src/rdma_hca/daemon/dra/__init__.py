"""The DRA driver: the node's HCAs as ResourceSlices, prepared into CDI devices.

``driver.DraDriver`` is the whole public surface: build it from a
:class:`config.DriverConfig` (the driver's view of the daemon's settings), feed it
inventories with ``update``, ``start``/``stop`` it beside (or instead of) the device
plugin pools, and read its ``stats()``. Inside, the kubelet plugin helper
(``kubeletplugin/``, with the slice publisher beside it, ``resourceslice/``) and the
driver proper (``prepare``, ``recovery``, ``offering``) meet at one seam,
``kubeletplugin/plugin.py``.
"""
