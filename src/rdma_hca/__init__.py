"""rdma-hca: a Kubernetes device plugin that offers a node's RDMA HCAs as ``rdma/hca``."""

__version__ = "0.1.0"
