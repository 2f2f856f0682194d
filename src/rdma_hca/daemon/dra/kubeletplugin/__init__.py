"""The kubelet plugin helper: what the upstream helper owns, apart from the driver proper.

As ``k8s.io/dynamic-resource-allocation/kubeletplugin`` splits it: the options checked
once at start (``options``), the sockets and the registration (``sockets``), the
DRAPlugin and health services (``services``, ``health``), fetching and checking each
claim before serializing (``fetch``), the per-claim and cross-instance serialization
(``serialize``) and publishing the node's slice (the sibling package ``resourceslice``),
composed by :class:`helper.Helper`. The driver proper sees one seam,
``plugin.DriverPlugin``: one prepare and one unprepare per call, of typed claims.
"""
