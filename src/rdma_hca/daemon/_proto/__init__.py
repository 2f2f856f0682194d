"""Generated code for the kubelet device plugin API v1beta1 (see api.proto).

Regenerate with ``scripts/gen-proto.sh``; ``tests/test_proto.py`` fails when the
committed files differ from what the pinned generator produces.
"""

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc

__all__ = ["api_pb2", "api_pb2_grpc"]
