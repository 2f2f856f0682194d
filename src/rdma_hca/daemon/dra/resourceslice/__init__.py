"""The slice publisher, the helper's as upstream's ``resourceslice`` package is beside
``kubeletplugin``: the node's desired devices in, the API server's ResourceSlices kept
equal to them.

``slices`` holds the slice records and how a pool's devices are cut into slices (pure),
``pace`` the pool's queue and the spacing of writes, ``publisher`` the loop that writes.
The devices come typed from ``dra/devices.py`` (the offer's records); that module knows
nothing of this package.
"""
