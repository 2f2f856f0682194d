"""Names the DRA tests share."""

DRIVER = "rdma-hca.io"
NODE = "node-a"
